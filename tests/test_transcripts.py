"""Nothing travels outside the Comm (DESIGN.md): for every registered algorithm, the transcript of a 3-round run
reconstructs each agent's iterates from that agent's own state and the messages it received — the agent is re-run
with every other row set to NaN and its incoming messages served from the transcript, and must end bit for bit
where it ended (any read of another agent's row, a hidden matrix product with W, or a side channel would put a
NaN or a different number there). Bit for bit holds by construction: the replay runs the same kernels on the same
shapes, the agent's row at the same position, and no kernel mixes rows (the NaN rows cannot reach it but through a
read of another agent's row, which is what the test looks for)."""

from __future__ import annotations

import math

import pytest
import torch

from privdl.algorithms import ALGORITHMS, make_algorithm
from privdl.comm import ReplayComm, SparseComm, Transcript
from privdl.comm.base import LINEAR_MIXING
from privdl.keys import Keys
from privdl.mechanisms import IdentityEncoding, MessageMechanism, make_mechanism, protect
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task

VARIANTS = {
    "dsgd": [{}, {"form": "cta", "optimizer": {"name": "sgd", "momentum": 0.9}}],
    "dsgt": [{}],
    "dinno": [{"primal_steps": 2, "optimizer": "adam"}],
    "central_sgd": [{}],
    "exact_diffusion": [{}],
    "dsg_rms": [{}, {"structure": "sparse", "protection": "tanh", "law": "rademacher"}],
    "edsg_rms": [{"structure": "upper_bidiagonal", "protection": "erf"}],
    "dsgt_rms": [{"structure": "diagonal"}],
    "pd_lms": [{"scheme": "independent", "variance": 0.1}, {"scheme": "nullspace", "variance": 0.1},
               {"scheme": "edge", "variance": 0.1}],
    "psgt": [{}, {"self_perturbed": False}],
    "dpdl": [{}, {"self_noise": True, "calibration": False}],
    "cga": [{"beta": 0.5}],
    "sgp": [{}],
}
ROUNDS = 3


def test_every_registered_algorithm_is_covered():
    assert set(VARIANTS) == set(ALGORITHMS.names())


def _setup(name, params):
    net = Network.from_topology("erdos_renyi", 5, p=0.6, seed=3)
    task = make_task("softmax", 5, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    alg = make_algorithm(name, **params)
    return net, task, alg


def _mechanism(net, task, alg, kind):
    steps = alg.accesses(ROUNDS, net.edges)
    if kind == "decor" and alg.cross:  # cross-gradients refuse correlated noise (tests/test_dpdl.py)
        kind = "none"
    if kind == "decor" and alg.combines != LINEAR_MIXING:  # DECOR needs linear mixing: LDP, its independent member
        kind = "ldp"
    if kind == "none":
        return make_mechanism("none", steps=steps)
    if kind == "dp_sgd":
        return make_mechanism("dp_sgd", steps=steps, task=task, clip=1.0, lot_size=20, noise_multiplier=1.0)
    return make_mechanism(kind, steps=steps, network=net, clip=1.0, epsilon=20.0)


@pytest.mark.parametrize("name,params", [(n, p) for n, ps in VARIANTS.items() for p in ps])
@pytest.mark.parametrize("kind", ["decor", "dp_sgd"])
@pytest.mark.exact
def test_the_transcript_reconstructs_every_agents_iterates(name, params, kind):
    net, task, alg = _setup(name, params)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    comm = SparseComm(net)
    transcript = Transcript()
    x0 = task.init_params(Keys(11, 5).generator("init")).expand(5, -1).clone() + 0.01 * torch.arange(5.0)[:, None]
    real = simulate(task=task, comm=comm, algorithm=alg, mechanism=_mechanism(net, task, alg, kind), schedule=sched,
                    iterations=ROUNDS, keys=Keys(11, 5), x0=x0, metrics=False, observers=[transcript])
    assert transcript.messages and {m.t for m in transcript.messages} >= set(range(1, ROUNDS + 1))
    for agent in range(5):
        blind = x0.clone()
        blind[torch.arange(5) != agent] = math.nan
        replay = simulate(task=task, comm=ReplayComm(transcript, comm, agent), algorithm=alg,
                          mechanism=_mechanism(net, task, alg, kind), schedule=sched, iterations=ROUNDS,
                          keys=Keys(11, 5), x0=blind, metrics=False)
        assert torch.equal(replay.final[agent], real.final[agent]), (name, agent)


def test_message_tags_say_what_each_algorithm_exchanges():
    sched = make_schedule("constant", eta=0.1, iterations=2)
    seen = {}
    for name, params in [("dsgd", {}), ("dsgt", {}), ("dinno", {}), ("central_sgd", {})]:
        net, task, alg = _setup(name, params)
        tr = Transcript()
        simulate(task=task, network=net, algorithm=alg, mechanism=make_mechanism("none", steps=alg.accesses(
            2, net.edges)), schedule=sched, iterations=2, seed=0, metrics=False, observers=[tr])
        seen[name] = [tag for t, tag in tr.tags() if t == 2]
    assert seen == {"dsgd": ["x"], "dsgt": ["theta", "y"], "dinno": ["theta"], "central_sgd": ["gradient"] * 2}


# ---- message-side mechanisms ------------------------------------------------------------------------------------
def _run(comm_of, observers=()):
    net, task, alg = _setup("dsgt", {})
    mech = make_mechanism("ldp", steps=alg.accesses(4, net.edges), network=net, clip=1.0, epsilon=10.0)
    return simulate(task=task, comm=comm_of(net), algorithm=alg, mechanism=mech,
                    schedule=make_schedule("constant", eta=0.1, iterations=4), iterations=4, seed=2, metrics=False,
                    observers=observers)


@pytest.mark.exact
def test_identity_encoding_equals_no_message_mechanism_bit_for_bit():
    plain_tr, wrapped_tr = Transcript(), Transcript()
    plain = _run(SparseComm, [plain_tr])
    wrapped = _run(lambda net: protect(SparseComm(net), IdentityEncoding()), [wrapped_tr])
    assert torch.equal(plain.final, wrapped.final)
    assert len(plain_tr.messages) == len(wrapped_tr.messages)
    assert all(torch.equal(a.payload, b.payload) for a, b in zip(plain_tr.messages, wrapped_tr.messages))


class Shift(MessageMechanism):
    """Adds a constant to what is sent and removes it after combining (a protection vector in miniature)."""

    name = "shift"

    def __init__(self, c: float) -> None:
        self.c = c

    def encode(self, x, *, tag, t):
        sent = x + self.c
        return sent, x - sent


class Scale(MessageMechanism):
    name = "scale"

    def __init__(self, a: float) -> None:
        self.a = a

    def encode(self, x, *, tag, t):
        return self.a * x, None


def test_message_wrappers_compose_in_order_and_the_wire_sees_the_composition():
    net = Network.from_topology("ring", 4)
    x = torch.randn(4, 3, dtype=torch.float64)
    wires = []
    for order in ((Shift(1.0), Scale(2.0)), (Scale(2.0), Shift(1.0))):
        inner = SparseComm(net)
        tr = inner.attach(Transcript())
        protect(inner, *order).mix(x, tag="x")
        wires.append(tr.messages[0].payload)
    e = net.edges
    assert torch.allclose(wires[0], 2 * (x[e.src] + 1))  # shift first, then scale
    assert torch.allclose(wires[1], 2 * x[e.src] + 1)  # scale first, then shift
    # a protection removed by its sender leaves the network average unchanged
    inner = SparseComm(net)
    mixed = protect(inner, Shift(5.0)).mix(x, tag="x")
    assert torch.allclose(mixed.mean(0), x.mean(0), atol=1e-12)


# ---- gradient-side chains -----------------------------------------------------------------------------------------
def test_chain_order_matters_where_it_should():
    """clip → noise is the Gaussian mechanism with sensitivity 2C; noise → clip has no sensitivity bound before the
    noise, so it carries no DP guarantee — and its outputs all have norm ≤ C."""
    from privdl.keys import Keys as K
    from privdl.mechanisms import Access, Clip, MechanismEnv, chain

    net = Network.from_topology("complete", 4)
    C, sigma, steps = 0.5, 2.0, 30
    noise = lambda: make_mechanism("ldp", steps=steps, network=net, clip=0, sigma=sigma)  # noqa: E731
    clip_then_noise = chain(Clip(steps=steps, clip=C), noise())
    noise_then_clip = chain(noise(), Clip(steps=steps, clip=C))
    reference = make_mechanism("ldp", steps=steps, network=net, clip=C, sigma=sigma)
    a, b = clip_then_noise.ledger(), noise_then_clip.ledger()
    assert a.unit == "agent" and a.epsilon == pytest.approx(reference.ledger().epsilon, rel=1e-12)
    assert b.epsilon is None and "no DP guarantee" in b.guarantee
    rows = torch.arange(4)
    g = 10 * torch.randn(4, 50, dtype=torch.float64)
    outs = []
    for m in (clip_then_noise, noise_then_clip):
        m.bind(MechanismEnv(K(0, 4)))
        outs.append(m.privatize(g, Access(rows, rows, 1)))
    assert bool((outs[1].norm(dim=1) <= C * (1 + 1e-12)).all())
    assert bool((outs[0].norm(dim=1) > C).all())  # noise of std 2 on 50 coordinates
    assert not torch.allclose(outs[0], outs[1])
