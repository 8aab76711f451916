"""No directed W by accident, and files that say what is wrong with them (issue 29, items 4 and 5).

Every loader of a mixing matrix refuses a W whose support is not symmetric, naming a pair (i, j) that the matrix
itself shows to be directed; every file privdl reads names itself and what is wrong when it is empty, cut short,
mis-encoded or of another kind (the whole catalogue runs in tests/test_bad_inputs.py through the sweep's file
section; here, the library functions beneath it)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import scipy.sparse as sps
from typer.testing import CliRunner

from privdl.cli import app
from privdl.data.files import read_json, read_matrix, read_text
from privdl.errors import ConfigError, FileError, ValidationError
from privdl.experiment import load_config, run_experiment
from privdl.network import Network, load_network_file, validate_mixing_matrix
from privdl.network.sparse import validate_sparse

#: the pairs (i, j) with W_ij > 0 = W_ji of :func:`_directed_w`: a directed 3-cycle 0 → 2 → 4 → 0 over a ring
DIRECTED = {(0, 2), (2, 4), (4, 0)}


def _directed_w(a: float = 0.1) -> np.ndarray:
    """A lazy ring of 6 agents (symmetric) plus a directed cycle of weight ``a`` on three non-edges, paid for by
    the diagonal: doubly stochastic, non-negative, connected and primitive — only its support is not symmetric."""
    n = 6
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i], w[i, (i + 1) % n], w[i, (i - 1) % n] = 0.5, 0.25, 0.25
    for i, j in DIRECTED:
        w[i, j] += a
        w[i, i] -= a
    return w


def _named_pair(message: str, symbol: str = "W") -> tuple[int, int]:
    """The pair an error names as "W[i,j] = x but W[j,i] = 0", checked against the form of the message."""
    m = re.search(rf"{symbol}\[(\d+),(\d+)\] = [0-9.e+-]+ but {symbol}\[(\d+),(\d+)\] = 0\b", message)
    assert m, message
    i, j, jj, ii = (int(g) for g in m.groups())
    assert (ii, jj) == (i, j), message
    return i, j


def test_the_directed_w_is_otherwise_a_valid_mixing_matrix():
    """(So that each refusal below is the support check's: W is doubly stochastic and its symmetrisation passes.)"""
    w = _directed_w()
    assert np.allclose(w.sum(axis=0), 1) and np.allclose(w.sum(axis=1), 1) and w.min() >= 0
    support = w > 0
    assert {(int(i), int(j)) for i, j in np.argwhere(support & ~support.T)} == DIRECTED
    validate_mixing_matrix(0.5 * (w + w.T))


@pytest.mark.parametrize("load", [
    pytest.param(lambda w, tmp: validate_mixing_matrix(w), id="validate_mixing_matrix"),
    pytest.param(lambda w, tmp: Network(w), id="Network"),
    pytest.param(lambda w, tmp: Network.from_matrix(w), id="Network.from_matrix"),
    pytest.param(lambda w, tmp: validate_sparse(sps.csr_array(w)), id="sparse"),
    pytest.param(lambda w, tmp: Network(sps.csr_array(w)), id="Network(sparse)"),
])
def test_every_constructor_refuses_a_directed_w_naming_a_directed_pair(tmp_path, load):
    w = _directed_w()
    with pytest.raises(ValidationError, match="symmetric support") as info:
        load(w, tmp_path)
    assert _named_pair(str(info.value)) in DIRECTED


@pytest.mark.parametrize("name,kind", [("w.npy", "auto"), ("w.npy", "mixing"), ("w.csv", "auto"), ("w.txt", "auto"),
                                       ("w.txt", "mixing")])
def test_every_file_format_refuses_a_directed_w_naming_the_file_and_a_pair(tmp_path, name, kind):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, _directed_w())
    else:
        np.savetxt(path, _directed_w(), delimiter="," if name.endswith(".csv") else " ")
    with pytest.raises(ValidationError, match="symmetric support") as info:
        load_network_file(path, kind=kind)
    assert str(path) in str(info.value) and _named_pair(str(info.value)) in DIRECTED


def test_an_adjacency_matrix_must_be_symmetric_and_an_edge_list_is_undirected(tmp_path):
    a = np.zeros((4, 4))
    for i, j in ((0, 1), (1, 2), (2, 3), (3, 0)):
        a[i, j] = a[j, i] = 1
    a[1, 3] = 1  # one directed pair: 1 → 3 without 3 → 1
    np.savetxt(tmp_path / "a.txt", a, fmt="%d")
    with pytest.raises(ValidationError, match="symmetric support") as info:
        load_network_file(tmp_path / "a.txt")
    assert _named_pair(str(info.value), "A") == (1, 3)
    (tmp_path / "e.txt").write_text("0 1\n1 2\n2 3\n")  # each line one undirected edge: W has both directions
    w = load_network_file(tmp_path / "e.txt").W
    assert {(int(i), int(j)) for i, j in np.argwhere(w > 0) if i != j} == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 3),
                                                                           (3, 2)}


def test_a_config_network_file_and_the_mixing_options_refuse_a_directed_w(tmp_path):
    np.save(tmp_path / "w.npy", _directed_w())
    (tmp_path / "c.toml").write_text('iterations = 2\n[network]\nfile = "w.npy"\n[task]\nname = "quadratic"\n'
                                     '[schedule]\nname = "constant"\neta = 0.01\n')
    with pytest.raises(ValidationError, match="symmetric support") as info:
        run_experiment(load_config(tmp_path / "c.toml"), tmp_path / "out", progress=False)
    assert "w.npy" in str(info.value) and _named_pair(str(info.value)) in DIRECTED
    for args in (["covariance", "--epsilon", "1", "--mixing", str(tmp_path / "w.npy")],
                 ["rms-bounds", "--dim", "2", "--mixing", str(tmp_path / "w.npy")]):
        res = CliRunner().invoke(app, args)
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and res.exception is None or isinstance(res.exception, SystemExit), text
        assert "w.npy" in text and "symmetric support" in text and _named_pair(text) in DIRECTED, text


def test_a_two_line_edge_list_is_an_edge_list_not_a_2x2_matrix(tmp_path):
    """"0 1 / 1 2" is the path 0 – 1 – 2 on three agents (it used to be read as a 2×2 W); a 2×2 table of
    non-integers is W (a 2×2 integer matrix is never a valid W, and as an adjacency it is the same graph)."""
    for name, text in (("e.txt", "0 1\n1 2\n"), ("e.csv", "0,1\n1,2\n")):
        (tmp_path / name).write_text(text)
        net = load_network_file(tmp_path / name)
        assert net.n == 3 and sorted(net.graph.edges()) == [(0, 1), (1, 2)]
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2]]))
    assert load_network_file(tmp_path / "e.npy").n == 3
    np.savetxt(tmp_path / "w.txt", np.full((2, 2), 0.5))
    assert load_network_file(tmp_path / "w.txt").n == 2
    (tmp_path / "b.txt").write_text("1 2\n2 3\n3 1\n")  # numbered from 1: agent 0 in no edge
    with pytest.raises(ValidationError, match=r"agents \[0\] are in no edge .*numbered from 1"):
        load_network_file(tmp_path / "b.txt")


@pytest.mark.parametrize("content,match", [
    (b"", "is empty"),
    (b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (5, 5), }", "cut short"),
    (b"0.5 0.5\n0.5\n", r"line 2: 1 number, but line 1 has 2"),
    (b"0.5 nan\n0.5 0.5\n", r"row 1, column 2 is nan"),
    (b"i j\n0 1\n", r"line 1, column 1: 'i', not a number \(a header line"),
    (b"# only a comment\n", "holds no numbers"),
    (b"PK\x03\x04rest", "zip archive"),
    ("0,5;0,5\n".encode(), "semicolons"),
    ("# é\n0 1\n".encode("latin-1"), r"not UTF-8 text: byte 0xe9 at line 1, column 3"),
    (bytes(range(256)) * 8, "binary data"),
])
def test_read_matrix_names_the_file_and_what_is_wrong(tmp_path, content, match):
    path = tmp_path / "m.txt"
    path.write_bytes(content)
    with pytest.raises(FileError, match=match) as info:
        read_matrix(path, "network file")
    assert str(info.value).startswith(f"network file {path}")


def test_text_in_utf8_with_a_bom_or_utf16_reads_as_its_text(tmp_path):
    text = 'name = "é"\nx = 1\n'
    for i, data in enumerate((b"\xef\xbb\xbf" + text.encode(), text.encode("utf-16"), text.encode("utf-16-be"),
                              text.encode("utf-32"))):
        if i == 2:
            data = b"\xfe\xff" + data
        (tmp_path / f"t{i}").write_bytes(data)
        assert read_text(tmp_path / f"t{i}", "config file") == text
    (tmp_path / "plain").write_bytes(text.encode("utf-16-le"))  # no byte-order mark: refused, with a hint
    with pytest.raises(FileError, match="is UTF-16 text without a byte-order mark"):
        read_text(tmp_path / "plain", "config file")


def test_read_json_says_cut_short_and_other_kinds(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"a": [1, 2, 3]})[:-4])
    with pytest.raises(FileError, match="ends before its JSON does"):
        read_json(path, "manifest")
    path.write_text("[1, 2]")
    with pytest.raises(FileError, match="holds a JSON list, not a JSON object"):
        read_json(path, "manifest")
    path.write_text("{\n  'a': 1\n}")
    with pytest.raises(FileError, match="not valid JSON: .* at line 2"):
        read_json(path, "manifest")


def test_a_config_path_that_is_a_folder_is_called_a_folder(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"is a folder, not a file \(an experiment's output folder"):
        load_config(tmp_path / "exp")
    with pytest.raises(ConfigError, match="does not exist: .*afile is a file, not a folder"):
        (tmp_path / "afile").write_text("x")
        load_config(tmp_path / "afile" / "c.toml")


def test_out_through_a_file_or_on_a_read_only_place_is_a_clear_error(tmp_path):
    (tmp_path / "c.toml").write_text('iterations = 2\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = '
                                     '"quadratic"\n[schedule]\nname = "constant"\neta = 0.01\n')
    (tmp_path / "f").write_text("x")
    if os.geteuid() == 0:  # permissions do not bind root: a read-only file system does
        read_only = "/proc/privdl-out"
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        read_only = str(tmp_path / "ro" / "out")
    for out, match in ((tmp_path / "f" / "sub", r"cannot be made: \S*f is a file, not a folder"),
                       (read_only, "cannot be made")):
        res = CliRunner().invoke(app, ["run", str(tmp_path / "c.toml"), "--out", str(out), "--no-plot"])
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), text
        assert re.search(match, text) and str(out) in text, text
