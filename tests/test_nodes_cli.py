#!/usr/bin/env python3
"""test_nodes_cli.py — `qtrain --nodes N` as a launcher starts it: two processes on 127.0.0.1 with
NODE_RANK/NNODES/MASTER_ADDR/MASTER_PORT meet, and the CPU config is then refused on both (training across
nodes runs on GPUs: tools/gpu-nodes.sh trains); a differing config on one
node, malformed launcher variables and a missing launcher fail naming the node or the variable."""
import os
import socket
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, run_tests

QTRAIN = os.path.join(BUILD, "qtrain")
CONFIG = os.path.join(ROOT, "configs", "tiny-cpu.yaml")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT")


def env(**kv):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "OMPI_"))}
    e.update({k: str(v) for k, v in kv.items()})
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(rank, port, *extra):
    if not os.access(QTRAIN, os.X_OK):
        raise Skip(f"{QTRAIN} not built")
    return subprocess.Popen([QTRAIN, CONFIG, "--nodes", "2", "--set", "device=cpu", *extra], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env(NODE_RANK=rank, NNODES=2, MASTER_ADDR="127.0.0.1",
                                                            MASTER_PORT=port))


def finish(p, with_out=False):
    out, err = p.communicate(timeout=60)
    return (p.returncode, out, err) if with_out else (p.returncode, err)


def test_two_nodes_meet(tmp):
    """The nodes meet, then the CPU config is refused on every node: training across nodes runs on GPUs."""
    port = free_port()
    ps = [start(r, port) for r in (1, 0)]
    for r, p in zip((1, 0), ps):
        rc, out, err = finish(p, True)
        assert rc == 1, f"node {r}: exit {rc}, stderr {err!r}"
        want = f"parallel.nodes 2: node {r} met the others (env launch, node 0 at 127.0.0.1:{port}"
        assert want in out, f"node {r}: {out!r}"
        assert "parallel.nodes: 2: training across nodes runs on GPUs" in err, f"node {r}: {err!r}"


def test_config_differs(tmp):
    port = free_port()
    ps = [start(0, port), start(1, port, "--set", "optim.lr=0.5")]
    for r, p in enumerate(ps):
        rc, err = finish(p)
        assert rc == 1 and "node 1: config hash" in err, f"node {r}: exit {rc}, stderr {err!r}"


def test_bad_launcher_vars(tmp):
    if not os.access(QTRAIN, os.X_OK):
        raise Skip(f"{QTRAIN} not built")
    cases = [({"NODE_RANK": 0, "NNODES": 2, "MASTER_ADDR": "h", "MASTER_PORT": "29x"}, 'MASTER_PORT="29x"'),
             ({"RANK": 2, "WORLD_SIZE": 2, "MASTER_ADDR": "h", "MASTER_PORT": 1}, "RANK=2 is not below WORLD_SIZE=2"),
             ({"NODE_RANK": 1, "NNODES": 2, "MASTER_PORT": 1}, "MASTER_ADDR is not set"),
             ({"NODE_RANK": 0, "NNODES": 3, "MASTER_ADDR": "h", "MASTER_PORT": 1}, "NNODES=3 processes but parallel.nodes 2"),
             ({}, "parallel.nodes 2: no launcher variables")]
    for kv, want in cases:
        r = subprocess.run([QTRAIN, CONFIG, "--nodes", "2"], cwd=ROOT, text=True, capture_output=True, env=env(**kv),
                           timeout=60)
        assert r.returncode == 1 and want in r.stderr, f"{kv}: exit {r.returncode}, stderr {r.stderr!r}"
    r = subprocess.run([QTRAIN, CONFIG, "--nodes", "0"], cwd=ROOT, text=True, capture_output=True, env=env(), timeout=60)
    assert r.returncode == 2 and "--nodes: expected a number of machines" in r.stderr, r.stderr


if __name__ == "__main__":
    sys.exit(run_tests(globals(), sys.argv[1:]))
