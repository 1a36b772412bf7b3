"""A serving engine emulated with ddsim's own layers, writing verify-step dumps (ddsim.engines.dump) clean or
with one planted integration bug, for tests/test_replay.py.

Each step the engine verifies a tree around the target's greedy continuation: node 1, 3, 5, ... the
greedy tokens, each with a sibling after it (node 2, 4, 6, ...), so the greedy path's nodes below
depth 1 are not order-exact and the flattened recurrence reaches them. It accepts greedily on its own
logits, emits the accepted tokens and the bonus token, and dumps what it computed.

Bugs (one per engine):
  leak          the flattened recurrence (hybrid-unsafe verification)
  positions     per-node RoPE positions ignored: context + node index (the dump still records the
                intended positions, as an engine's position buffer would)
  shift         every RoPE position one past the tree's (an off-by-one prefix length; the dump records
                the intended positions)
  mask          the first node with an earlier node outside its ancestors has that node blended in (node 2
                and node 1 on the greedy-plus-sibling tree)
  causal        attention over the tree by a causal mask in batch order (every earlier node, siblings
                included) in place of the tree's ancestor mask
  flat          the whole tree flattened: the flattened recurrence and that causal attention
  leak-state    the flattened recurrence in the state alone (the conv window by the tree)
  leak-conv     the flattened conv window alone (the state by the tree)
  drift         noise added to the committed recurrent state, one more of its scale every step
                (an approximate rollback that drifts)
  stale         at step 2 the GDN state and conv window are the previous step's (a stale cache block)
  dump-stale    at step 2 the dumped committed state (ssm.L, conv.L) is the previous step's while the verify reads
                the right one (the dump reads a stale buffer): the logits are right, the dumped state is not
  bonus         at step 1 the bonus emitted is the runner-up of the engine's own logits, not their argmax
  accept        at step 1 the engine stops a node short of its own greedy walk and emits its argmax there as
                the bonus (an acceptance test off by one node); it commits what it emitted
  commit        after step 1 the engine commits the rejected sibling of the last accepted node (its
                logits and accepted path are right; the next step's context is not)
  root          at step 2 the root is not the previous bonus (a token dropped between steps)
  commit-state  every step commits the recurrent state and conv window at node len(path) - 1 (the accepted
                path's length read as a batch index) in place of the last accepted node's; the KV is right
  commit-kv     every step keeps the attention KV rows of nodes 0 .. len(path) - 1 in place of the accepted
                path's; the recurrent state is right
  commit-once   at step 1 alone the recurrent state and conv window are committed at node len(path) (that batch
                index off by one)
  commit-node   every step commits the recurrent state and conv window of the tree's last node, T - 1, a
                rejected sibling no commit rule of the replay names (found by its search); the KV is right
  commit-norollback  the KV rows of every node of the tree stay in the cache after each step (the rejected ones
                included, in batch order); positions still count the committed tokens
For the tree bugs and the stale read the engine commits from an exact verify, so each step shows
the bug alone and the state stays right; drift corrupts the committed state itself.

Sampled (``sampler`` {rule, temperature, params}): the engine accepts with that rule of ddsim.sampling.rules
on softmax(logits / T), drawing its random numbers per (request, step), and dumps them. Its own bugs:
  rule          it accepts with threshold_acc = 0.5 while the dump declares the rule's lossless setting
  coins         at step 1 it dumps random numbers other than those it drew
"""
import torch

from ddsim.engines.dump import VerifyDumpWriter
from ddsim.engines.replay_verdict import greedy_walk
from ddsim.trees.tree import Tree

BUGS = (None, "leak", "leak-state", "leak-conv", "positions", "shift", "mask", "causal", "flat", "drift", "stale",
        "dump-stale", "bonus", "accept", "commit", "root", "commit-state", "commit-kv", "commit-once",
        "commit-node", "commit-norollback", "rule", "coins")


def _continuation(model, state, root: int, depth: int) -> torch.Tensor:
    """The target's logits [depth, V] along its greedy continuation of ``root``, one token at a time."""
    rows, st, tok = [], state, root
    for _ in range(depth):
        t = Tree([-1], [tok])
        res = model.verify(st, t, mode="exact")
        st = model.commit(st, t, res, 0)
        rows.append(res.logits[0])
        tok = int(res.logits[0].argmax())
    return torch.stack(rows)


def _tree(model, state, root: int, depth: int) -> Tree:
    """Root, then per depth the greedy token and a sibling (the next token id that differs)."""
    greedy = [int(t) for t in _continuation(model, state, root, depth).argmax(-1)]
    parents, tokens = [-1], [root]
    prev = 0
    for g in greedy:
        parents += [prev, prev]
        tokens += [g, (g + 1) % model.cfg.vocab_size]
        prev = len(tokens) - 2
    return Tree(parents, tokens)


def _ddtree(model, state, root: int, *, depth: int, budget: int, topk_cap: int, seed: int) -> Tree:
    """A DDTree of ``budget`` nodes under the root, drafted from the target's own greedy continuation: the logits at
    each depth of that continuation with a tenth of their own scale of noise (so the draft's best token is not
    always the target's and the accepted path leaves batch order), sharpened as a confident drafter's are."""
    from ddsim.trees.builders import ddtree
    draft = _continuation(model, state, root, depth).double()  # [depth, V]
    gen = torch.Generator().manual_seed(seed)
    scale = draft.std(-1, keepdim=True)
    draft = draft + 0.1 * scale * torch.randn(draft.shape, generator=gen, dtype=draft.dtype)
    return ddtree(draft * (4.0 / scale), budget, topk_cap, root_token=root)  # a confident drafter: deep trees


class EmulatedEngine:
    def __init__(self, model, *, bug: str | None = None, depth: int = 3, dump_states: bool = False,
                 sampler: dict | None = None, topk: int | None = None, ddtree: tuple[int, int] | None = None):
        """``ddtree`` (budget, top-k cap): verify DDTree trees drafted from noised target logits (_ddtree) in place
        of the greedy-plus-sibling trees."""
        assert bug in BUGS, bug
        self.model, self.bug, self.depth, self.dump_states = model, bug, depth, dump_states
        self.sampler, self.topk, self.ddtree = sampler, topk, ddtree

    def _sample(self, tree, logits, request: str, k: int):
        """(path, bonus, the random numbers to dump) under the engine's rule."""
        from ddsim.sampling.rules import RULES, draw_randoms
        from ddsim.trees.seeds import derive_seed
        rule = RULES[self.sampler["rule"]]
        gen = torch.Generator().manual_seed(derive_seed(7, f"engine-{request}", k))
        V = logits.shape[-1]
        randoms = draw_randoms(rule.randoms, R=1, T=tree.size, D=int(tree.depths.max()), V=V, generator=gen)
        params = dict(self.sampler["params"])
        if self.bug == "rule":
            params["threshold_acc"] = 0.5
        probs = torch.softmax(logits.double() / self.sampler["temperature"], -1)
        path, bonus = rule.fn(parents=torch.tensor(tree.parents), tokens=torch.tensor(tree.tokens)[None],
                              target=probs[None], randoms=randoms, **params)
        dumped = {n: v[0] for n, v in randoms.items()}
        if self.bug == "coins" and k == 1:
            dumped = {n: torch.rand(v.shape, generator=gen, dtype=v.dtype) for n, v in dumped.items()}
        return [int(x) for x in path[0] if x >= 0], int(bonus[0]), dumped

    def serve(self, writer: VerifyDumpWriter, *, request: str, prompt: list[int], steps: int) -> None:
        m = self.model
        context, root = list(prompt[:-1]), prompt[-1]
        state, _ = m.prefill(context)
        previous = state
        for k in range(steps):
            if self.ddtree:
                from ddsim.trees.seeds import derive_seed
                tree = _ddtree(m, state, root, depth=self.depth, budget=self.ddtree[0], topk_cap=self.ddtree[1],
                               seed=derive_seed(11, f"draft-{request}", k))
            else:
                tree = _tree(m, state, root, self.depth)
            T = tree.size
            verify_state = state
            if self.bug == "stale" and k == 2:
                verify_state = m.empty_state()
                verify_state.pos, verify_state.kv = state.pos, state.kv
                verify_state.ssm, verify_state.conv = previous.ssm, previous.conv
            kw = {}
            if self.bug == "positions":
                kw["positions"] = [len(context) + i for i in range(T)]
            if self.bug == "shift":
                kw["positions"] = [int(p) + 1 for p in tree.positions(len(context))]
            if self.bug == "mask":  # the first node with an earlier node outside its ancestors: that node blended in
                mask = tree.ancestor_mask.copy()
                t, j = next((t, j) for t in range(T) for j in range(t) if not mask[t, j])
                mask[t, j] = True
                kw["ancestor_mask"] = mask
            if self.bug in ("causal", "flat"):
                import numpy as np
                kw["ancestor_mask"] = np.tril(np.ones((T, T), dtype=bool))
            mode = {"leak": "leaky", "flat": "leaky", "leak-state": "leaky-state", "leak-conv": "leaky-conv"}
            res = m.verify(verify_state, tree, mode=mode.get(self.bug, "exact"), **kw)
            randoms = None
            if self.sampler:
                path, bonus, randoms = self._sample(tree, res.logits, request, k)
            else:
                path = greedy_walk(tree, res.logits)
                bonus = int(res.logits[path[-1]].argmax())
            if self.bug == "bonus" and k == 1:
                bonus = int(res.logits[path[-1]].topk(2).indices[1])
            if self.bug == "accept" and k == 1 and len(path) > 1:
                path = path[:-1]
                bonus = int(res.logits[path[-1]].argmax())
            if self.bug == "root" and k == 2:
                root = (root + 1) % m.cfg.vocab_size
                tree = Tree(tree.parents, [root, *tree.tokens[1:]])
                res = m.verify(verify_state, tree, mode="exact")
                path = greedy_walk(tree, res.logits)
                bonus = int(res.logits[path[-1]].argmax())
            states = {}
            if self.dump_states:  # the engine's committed recurrent state and conv window before the step
                dumped_state = previous if self.bug == "dump-stale" and k == 2 else state
                for i in m.cfg.recurrent_layers:
                    states[f"ssm.{i}"], states[f"conv.{i}"] = dumped_state.ssm[i], dumped_state.conv[i]
            dumped = {"logits": res.logits}
            if self.topk:  # the engine's k most likely tokens per node, most likely first, as log-probabilities
                top = torch.log_softmax(res.logits.float(), -1).topk(self.topk, dim=-1)
                dumped = {"topk": (top.indices, top.values)}
            writer.write_step(request=request, context=context, parents=tree.parents, tokens=tree.tokens,
                              positions=[int(p) for p in tree.positions(len(context))], **dumped,
                              accepted=path, emitted=[tree.tokens[i] for i in path[1:]] + [bonus], states=states,
                              randoms=randoms)
            if self.bug in ("leak", "leak-state", "leak-conv", "positions", "shift", "mask", "causal", "flat", "stale"):
                res = m.verify(state, tree, mode="exact")  # the state stays right: the bug shows alone
            previous = state
            committed = path
            if self.bug == "commit" and k == 1 and len(path) > 1:  # the sibling after the last accepted node
                committed = path[:-1] + [path[-1] + 1]
            new = m.commit(state, tree, res, committed[-1])
            x = {"commit-state": len(path) - 1, "commit-once": len(path) if k == 1 else None,
                 "commit-node": T - 1}.get(self.bug)
            if x is not None:  # the recurrent state and conv window of another node
                for i in m.cfg.recurrent_layers:
                    new.ssm[i], new.conv[i] = res.ssm[i][x].clone(), res.conv[i][x].clone()
            if self.bug in ("commit-kv", "commit-norollback"):  # the first len(path) nodes' KV rows, or every node's
                n = len(path) if self.bug == "commit-kv" else T
                new.kv = [None if kv is None else tuple(torch.cat([old, r[:n]]) for old, r in zip(kv, res.kv[i]))
                          for i, kv in enumerate(state.kv)]
            state = new
            if self.bug == "drift":  # an error that grows with every step: the state's own scale per step
                gen = torch.Generator().manual_seed(k)
                state.ssm = [None if s is None else s + (k + 1) * s.abs().mean() * torch.randn(
                    s.shape, generator=gen, dtype=s.dtype) for s in state.ssm]
            context += [tree.tokens[i] for i in committed]
            root = bonus


def write_dump(path, model, *, bug=None, prompts=((3, 1, 4, 1, 5), (2, 7, 1, 8)), steps: int = 4,
               dump_states: bool = False, sampler: dict | None = None, topk: int | None = None,
               compute_dtype: str = "float32", depth: int = 3, ddtree: tuple[int, int] | None = None) -> None:
    """``topk``: dump each node's k most likely tokens (logits "topk") in place of its full logits;
    ``compute_dtype``: the dtype the header declares (the model's own is the caller's); ``depth``, ``ddtree``: the
    trees (EmulatedEngine)."""
    with VerifyDumpWriter(path, vocab_size=model.cfg.vocab_size, engine={"name": f"emulated-{bug or 'clean'}"},
                          acceptance=sampler or "greedy", logits="topk" if topk else "full", topk=topk,
                          compute_dtype=compute_dtype) as w:
        eng = EmulatedEngine(model, bug=bug, dump_states=dump_states, sampler=sampler, topk=topk, depth=depth,
                             ddtree=ddtree)
        for r, prompt in enumerate(prompts):
            eng.serve(w, request=f"req-{r}", prompt=list(prompt), steps=steps)


def load_model(ckpt):
    from ddsim.model.checkpoint import load_checkpoint
    from ddsim.model.model import HybridModel
    cfg, weights, _ = load_checkpoint(ckpt)
    return HybridModel(cfg, weights, dtype=torch.float32)
