from properties.profiles import load

load()
