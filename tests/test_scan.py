"""`nanguard.scan` / `nanguard scan`: every format, chunk boundaries, exit codes, a >1 GB file."""

from __future__ import annotations

import gzip
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import nanguard
from _spawn import Spawn
from nanguard.cli import main as cli_main
from nanguard.datascan import ScanError, ScanReport

pa = pytest.importorskip("pyarrow")


def _col(r: ScanReport, name: str) -> dict[str, int]:
    c = next(c for c in r.columns if c.name == name)
    return {k: getattr(c, k) for k in ("count", "nan", "posinf", "neginf", "missing", "text", "fp16")}


def _cells(r: ScanReport) -> list[tuple[int, str, str]]:
    return [(b.index, c.column, c.kind) for b in r.bad_rows for c in b.cells]


CSV = (
    "id,age,income,label,score,note\n"
    "1,34,52000,cat,0.5,plain\n"
    '2,,61000,dog,nan,"a, quoted\nnewline"\n'
    "3,29,inf,cat,0.1,x\n"
    "4,NA,48000,,-1e6,y\n"
    "5,41,abc,dog,0.2,z\n"
    "6,33,1e400,cat, 0.3 ,w\n"
)


def test_csv_counts_and_first_rows(tmp_path: Path) -> None:
    p = tmp_path / "train.csv"
    p.write_text(CSV)
    r = nanguard.scan(p, fp16=True)
    assert r.found and r.rows == 6 and r.format == "CSV"
    assert _col(r, "age") == {"count": 6, "nan": 0, "posinf": 0, "neginf": 0, "missing": 2,
                              "text": 0, "fp16": 0}
    assert _col(r, "income")["posinf"] == 2 and _col(r, "income")["text"] == 1
    assert _col(r, "score")["nan"] == 1 and _col(r, "score")["fp16"] == 1
    age = next(c for c in r.columns if c.name == "age")
    assert (age.min, age.max) == (29, 41)  # empty cells are not zeros
    skipped = {c.name: c.skipped for c in r.columns if c.skipped}
    assert skipped == {"label": "text column", "note": "text column"}
    assert _cells(r) == [
        (1, "age", "missing"), (1, "score", "nan"), (2, "income", "+inf"),
        (3, "age", "missing"), (3, "score", "fp16"), (4, "income", "text"), (5, "income", "+inf"),
    ]
    text = str(r)
    assert "row 4: income='abc' (not a number)" in text
    assert "not checked: label (text column), note (text column)" in text


def test_csv_chunks_give_the_same_answer(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    vals = rng.standard_normal((3000, 3))
    lines = ["a,b,c"] + [",".join(f"{v:.6f}" for v in row) for row in vals]
    lines[1 + 2500] = "1.0,,3.0"  # row 2500: missing b
    lines[1 + 1234] = "nan,2.0,3.0"
    lines[1 + 2999] = "1.0,2.0,-inf"
    p = tmp_path / "big.csv.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    small = nanguard.scan(p, chunk_bytes=4096)
    whole = nanguard.scan(p)
    assert _cells(small) == _cells(whole) == [(1234, "a", "nan"), (2500, "b", "missing"),
                                               (2999, "c", "-inf")]
    assert [c.to_dict() for c in small.columns] == [c.to_dict() for c in whole.columns]
    assert small.rows == 3000 and small.bad_row_count == 3


def test_semicolon_separated_csv_is_read_by_its_separator(tmp_path: Path) -> None:
    p = tmp_path / "eu.csv"
    p.write_text("a;b;c\n1;2;3\n4;nan;6\n7;8;inf\n")
    r = nanguard.scan(p)
    assert [c.name for c in r.columns] == ["a", "b", "c"]
    assert _cells(r) == [(1, "b", "nan"), (2, "c", "+inf")]
    assert any("';'" in n for n in r.notes)


def test_clean_csv_with_bom_and_tsv(tmp_path: Path) -> None:
    p = tmp_path / "ok.csv"
    p.write_bytes("\ufeffx,y\n1,2\n3,4\n".encode())
    r = nanguard.scan(p)
    assert not r.found and [c.name for c in r.columns] == ["x", "y"]
    t = tmp_path / "ok.tsv"
    t.write_text("x\ty\n1\t\n")
    assert _col(nanguard.scan(t), "y")["missing"] == 1


def test_parquet_row_groups_nulls_and_lists(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    n = 5000
    f = np.arange(n, dtype=np.float64)
    f[4321] = np.nan
    i = pa.array(list(range(n)), pa.int64())
    emb = [[0.0, 1.0]] * n
    emb[77] = [0.0, float("inf")]
    table = pa.table({"f": f, "i": i, "s": ["a"] * n,
                      "emb": pa.array(emb, pa.list_(pa.float32()))})
    table = table.set_column(0, "f", pa.array([None if k == 10 else v for k, v in enumerate(f)]))
    p = tmp_path / "t.parquet"
    pq.write_table(table, p, row_group_size=1000)
    r = nanguard.scan(p, chunk_bytes=4096)
    assert r.rows == n and "5 row groups" in r.format
    assert _col(r, "f")["nan"] == 1 and _col(r, "f")["missing"] == 1
    assert _col(r, "i")["fp16"] == 0  # 4999 fits
    assert _col(r, "emb")["posinf"] == 1 and _col(r, "emb")["count"] == 2 * n
    assert _cells(r) == [(10, "f", "missing"), (77, "emb", "+inf"), (4321, "f", "nan")]
    assert next(c for c in r.columns if c.name == "s").skipped == "text column"


def test_npy_per_feature_chunked_and_fortran(tmp_path: Path) -> None:
    a = np.zeros((10_000, 4), np.float32)
    a[9_999, 3] = np.inf
    a[17, 1] = np.nan
    a[500, 0] = 7e4  # beyond float16
    p = tmp_path / "x.npy"
    np.save(p, a)
    for chunk in (1024, 1 << 20):
        r = nanguard.scan(p, chunk_bytes=chunk, fp16=True)
        assert _cells(r) == [(17, "[:, 1]", "nan"), (500, "[:, 0]", "fp16"), (9999, "[:, 3]", "+inf")]
    plain = nanguard.scan(p)  # float16 not asked for: counted, not a bad row
    assert plain.columns[0].fp16 == 1 and not plain.columns[0].issues(False)
    assert _cells(plain) == [(17, "[:, 1]", "nan"), (9999, "[:, 3]", "+inf")]
    pf = tmp_path / "f.npy"
    np.save(pf, np.asfortranarray(a))
    assert _cells(nanguard.scan(pf, chunk_bytes=1024, fp16=True)) == _cells(r)


def test_npy_samples_ints_and_pickles(tmp_path: Path) -> None:
    imgs = np.zeros((8, 3, 4, 4), np.float16)
    imgs[5, 2, 1, 3] = -np.inf
    np.save(tmp_path / "imgs.npy", imgs)
    r = nanguard.scan(tmp_path / "imgs.npy")
    assert r.unit == "sample" and r.bad_rows[0].index == 5
    assert r.bad_rows[0].cells[0].position == "[2, 1, 3]"
    np.save(tmp_path / "ids.npy", np.array([1, 70000, -3], np.int64))
    assert _col(nanguard.scan(tmp_path / "ids.npy"), "array")["fp16"] == 1
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="never unpickles"):
        nanguard.scan(tmp_path / "obj.npy")


def test_npz_members_are_streamed(tmp_path: Path) -> None:
    x = np.ones((1000, 8), np.float32)
    x[600, 7] = np.nan
    p = tmp_path / "d.npz"
    np.savez_compressed(p, x=x, y=np.arange(1000), z=np.array(1e9))
    r = nanguard.scan(p, chunk_bytes=2048, fp16=True)
    assert _cells(r) == [(0, "z", "fp16"), (600, "x", "nan")]
    assert r.bad_rows[1].cells[0].position == "[7]"


def test_pt_checkpoint_loaded_safely(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    state = {"model": {"w": torch.tensor([[1.0, float("nan")], [2.0, 3.0]]),
                       "b": torch.tensor([1e5, 0.0], dtype=torch.bfloat16)},
             "optim": [torch.zeros(3)], "step": 10}
    torch.save(state, tmp_path / "ckpt.pt")
    r = nanguard.scan(tmp_path / "ckpt.pt")
    assert _col(r, "model.w")["nan"] == 1 and _col(r, "model.b")["fp16"] == 1
    assert {c.name for c in r.columns} == {"model.w", "model.b", "optim[0]", "step"}
    # a pickle that would run code is refused, and its code never runs
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"

    class Evil:
        def __reduce__(self) -> tuple[object, ...]:  # only loading the file would run the command
            return (os.system, (f"touch {marker}",))

    torch.save({"x": Evil()}, evil)
    with pytest.raises(ValueError, match=r"holds Python objects beyond tensors .* never runs code"):
        nanguard.scan(evil)
    assert not marker.exists()
    # a whole pickled model: refused with the class it holds and what to save instead
    torch.save(torch.nn.Linear(2, 2), tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"it holds a torch\.nn\.modules\.linear\.Linear\).*state_dict"):
        nanguard.scan(tmp_path / "model.pt")
    assert cli_main(["scan", str(tmp_path / "model.pt")]) == 2  # one line on stderr, no traceback


def test_safetensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"emb": torch.tensor([[1.0, 2.0], [float("-inf"), 0.0]]),
                  "h": torch.full((3,), float("nan"), dtype=torch.bfloat16)},
                 str(tmp_path / "m.safetensors"))
    r = nanguard.scan(tmp_path / "m.safetensors", chunk_bytes=1024)
    assert _col(r, "emb")["neginf"] == 1 and _col(r, "h")["nan"] == 3
    assert _cells(r) == [(0, "h", "nan"), (1, "emb", "-inf"), (1, "h", "nan"), (2, "h", "nan")]


def test_dataset_and_dataloader() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

    x = torch.randn(100, 3)
    x[42, 1] = float("nan")
    y = torch.arange(100).float()
    y[7] = float("inf")
    ds = TensorDataset(x, y)
    r = nanguard.scan(ds)
    assert _cells(r) == [(7, "[1]", "+inf"), (42, "[0]", "nan")]
    assert r.bad_rows[1].cells[0].position == "[1]"
    rl = nanguard.scan(DataLoader(ds, batch_size=16))
    assert _cells(rl) == _cells(r) and rl.bad_rows[1].where == "batch 2, item 10" and not rl.notes
    shuffled = nanguard.scan(DataLoader(ds, batch_size=16, shuffle=True))
    assert any("not dataset indices" in n for n in shuffled.notes)

    class Items(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> dict[str, object]:
            img = torch.full((2, 2), 1e5) if i == 3 else torch.zeros(2, 2)
            return {"img": img, "label": i, "w": None if i == 2 else 1.0}

    ri = nanguard.scan(Items(), fp16=True)
    assert _cells(ri) == [(2, "w", "missing"), (3, "img", "fp16")]

    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from (torch.tensor([float(i)]) for i in range(5))
            yield torch.tensor([float("nan")])

    assert _cells(nanguard.scan(Stream())) == [(5, "tensor", "nan")]
    assert nanguard.scan(ds, max_samples=10).rows == 10


def test_objects_in_memory() -> None:
    torch = pytest.importorskip("torch")
    assert _cells(nanguard.scan(np.array([[1.0, np.nan], [3, 4]]))) == [(0, "[:, 1]", "nan")]
    t = nanguard.scan(torch.tensor([1.0, float("inf")], dtype=torch.bfloat16))
    assert _cells(t) == [(1, "tensor", "+inf")]
    assert _cells(nanguard.scan(pa.table({"a": [1.0, None]}))) == [(1, "a", "missing")]
    assert _cells(nanguard.scan({"a": np.array([0.0, -np.inf])})) == [(1, "a", "-inf")]
    mixed = nanguard.scan({"a": np.array([1.0, np.nan]), "b": torch.tensor([3.0, 4.0])})
    assert _cells(mixed) == [(1, "a", "nan")] and {c.name for c in mixed.columns} == {"a", "b"}
    assert not nanguard.scan(np.ones((3, 3))).found
    with pytest.raises(TypeError, match="cannot scan"):
        nanguard.scan(object())
    with pytest.raises(ValueError, match="unknown data format"):
        nanguard.scan(__file__)


def test_cli_exit_codes_json_and_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "clean.npy", np.ones((4, 2), np.float32))
    assert cli_main(["scan", str(tmp_path / "d")]) == 0
    assert "clean: no NaN/Inf" in capsys.readouterr().out
    (tmp_path / "d" / "bad.csv").write_text("a,b\n1,\n")
    assert cli_main(["scan", str(tmp_path / "d")]) == 3
    out = capsys.readouterr().out
    assert "bad.csv: CSV, 1 row, 2 columns checked" in out and "row 0: b='' (missing)" in out
    assert cli_main(["scan", "--json", str(tmp_path / "d" / "bad.csv")]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["found"] and doc[0]["totals"]["missing"] == 1
    assert doc[0]["bad_rows"][0] == {"index": 0, "cells": [
        {"column": "b", "kind": "missing", "value": "''", "position": None}], "where": None}
    np.save(tmp_path / "big.npy", np.array([1e5], np.float32))
    assert cli_main(["scan", "--fp16", str(tmp_path / "big.npy")]) == 3
    assert cli_main(["scan", "--no-fp16", str(tmp_path / "big.npy")]) == 0  # the old flag
    assert cli_main(["scan", str(tmp_path / "missing.csv")]) == 2
    (tmp_path / "x.txt").write_text("hi")
    assert cli_main(["scan", str(tmp_path / "x.txt")]) == 2
    capsys.readouterr()


def test_float32_data_beyond_float16_is_information_unless_fp16_is_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finite float32 values of 3e38 and an int64 of 100,000 are healthy data for a float32 run:
    the default exit status (a CI gate) is 0, the count is said as information; --fp16 makes
    them found (exit 3)."""
    big = np.ones((10, 3), np.float32)
    big[2, 0] = 3e38
    np.save(tmp_path / "big.npy", big)
    np.save(tmp_path / "ids.npy", np.array([1, 100_000, 5], np.int64))
    for name in ("big.npy", "ids.npy"):
        assert cli_main(["scan", str(tmp_path / name)]) == 0
        out = capsys.readouterr().out
        assert "clean: no NaN/Inf" in out
        assert "info: 1 finite value beyond float16 (|x| > 65504)" in out and "--fp16" in out
        assert cli_main(["scan", "--fp16", str(tmp_path / name)]) == 3
        assert "found: 1 beyond float16" in capsys.readouterr().out
    assert cli_main(["scan", "--json", str(tmp_path / "big.npy")]) == 0
    doc = json.loads(capsys.readouterr().out)[0]
    assert not doc["found"] and not doc["fp16_checked"] and doc["totals"]["fp16"] == 1


def test_a_closed_pipe_ends_the_scan_quietly(tmp_path: Path) -> None:
    """``nanguard scan DIR | head -2``: the reader goes away after two lines; the scan ends with
    the status a shell gives ``cat f | head`` (141), and no traceback."""
    import subprocess

    for i in range(40):  # ~320 kB of bad rows: more than a pipe holds, so the writer must wait
        a = np.zeros((400, 2), np.float32)
        a[::2, 1] = np.nan
        np.save(tmp_path / f"f{i:02d}.npy", a)
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "nanguard", "scan", "--max-rows", "1000",
                             str(tmp_path)],
                            stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        reader.readline(), reader.readline()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_a_file_larger_than_1gb_streams_in_bounded_memory(tmp_path: Path, spawn: Spawn) -> None:
    """1.1 GB of float32 (4.3M rows × 64) scanned in a fresh process: peak memory stays far
    below the file size (chunks of 16 MiB), and the two planted values are found."""
    path = tmp_path / "big.npy"
    rows, cols = 4_300_000, 64
    m = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    block = np.random.default_rng(0).standard_normal((100_000, cols), dtype=np.float32)
    for a in range(0, rows, 100_000):
        m[a : a + 100_000] = block[: min(100_000, rows - a)]
    m[3_000_123, 5] = np.nan
    m[4_299_999, 63] = np.inf
    m.flush()
    del m
    assert path.stat().st_size > 1 << 30
    code = textwrap.dedent(f"""
        import json, time

        def hwm():  # peak RSS of this process in KiB (VmHWM: ru_maxrss survives exec)
            with open("/proc/self/status") as fh:
                return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM"))

        import numpy, nanguard
        base = hwm()
        t = time.perf_counter()
        r = nanguard.scan({str(path)!r})
        dt = time.perf_counter() - t
        peak = hwm()
        print(json.dumps({{"seconds": dt, "growth_mb": (peak - base) / 1024,
                          "cells": [(b.index, c.column, c.kind) for b in r.bad_rows
                                    for c in b.cells], "rows": r.rows}}))
    """)
    out = spawn.python("-c", code, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rows"] == rows
    assert [tuple(c) for c in res["cells"]] == [(3_000_123, "[:, 5]", "nan"),
                                                (4_299_999, "[:, 63]", "+inf")]
    assert res["growth_mb"] < 200, res  # measured: ~35 MB for 1.1 GB (time is not asserted:
    # it depends on the machine's load; benchmarks/scan_big.py measures it)


# --- bad files, bad options, wide files ---------------------------------------------------------


def _bad_files(d: Path) -> list[Path]:
    """One file of each kind that cannot be read, named by its claimed format."""
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    whole = gzip.compress(b"a,b\n" + b"1,2\n" * 20000)
    files = {
        "empty.npz": b"", "corrupt.npz": b"PK\x03\x04" + noise[:200], "empty.pt": b"",
        "random.pt": noise[:1000], "empty.safetensors": b"", "corrupt.safetensors": noise[:100],
        "empty.csv.gz": b"", "truncated.csv.gz": whole[: len(whole) // 2],
        "binary.csv": b"a,b\n" + noise, "bad.npy": b"\x93NUMPY garbage",
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    return [d / name for name in files]


def test_unreadable_files_are_one_line_each_and_the_others_are_still_scanned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _bad_files(tmp_path)
    good = tmp_path / "train.csv"
    good.write_text("a,b\n1,2\n3,nan\n")
    paths = [str(p) for p in bad[:5]] + [str(good)] + [str(p) for p in bad[5:]]
    assert cli_main(["scan", *paths]) == 3  # the NaN in train.csv: found outranks unreadable
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "train.csv: CSV, 2 rows" in out
    lines = err.strip().splitlines()
    assert len(lines) == len(bad), err
    for p, line in zip(bad, lines):
        assert line.startswith(f"nanguard scan: {p}: "), line
    assert "it ends too early" in err and "binary data" in err and "empty file (0 bytes)" in err
    assert cli_main(["scan", *map(str, bad)]) == 2  # documented: 2 for unreadable
    capsys.readouterr()
    assert cli_main(["scan", "--json", *paths]) == 3
    out, err = capsys.readouterr()
    docs = json.loads(out)
    assert [d["source"] for d in docs] == paths
    assert [bool(d.get("error")) for d in docs] == [p != str(good) for p in paths]
    assert docs[5]["found"] is True and all(d["found"] is None for d in docs if "error" in d)
    for p in bad:
        with pytest.raises((ValueError, OSError, ImportError)):
            nanguard.scan(p)


def test_random_bytes_in_a_pt_file_are_not_called_a_pickled_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    p = tmp_path / "random.pt"
    p.write_bytes(b"\x80\x02" + bytes(range(256)) * 4)  # starts like a pickle, is not one
    with pytest.raises(ScanError, match="not a readable PyTorch file") as info:
        nanguard.scan(p)
    assert "pickled model" not in str(info.value)
    (tmp_path / "noise.pt").write_bytes(bytes(range(255, 0, -1)) * 4)
    with pytest.raises(ScanError, match="neither a zip archive nor a pickle"):
        nanguard.scan(tmp_path / "noise.pt")


def test_an_npz_with_an_object_member_is_not_called_clean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "mixed.npz"
    np.savez(p, meta=np.array([{"a": 1}], dtype=object), x=np.ones(3))
    r = nanguard.scan(p)
    assert not r.found and not r.complete and not r.clean and r.unchecked == ["meta"]
    assert "not all checked" in str(r) and "clean" not in str(r)
    assert r.to_dict()["complete"] is False
    assert cli_main(["scan", str(p)]) == 2
    capsys.readouterr()


def test_a_cell_longer_than_arrows_block_is_read(tmp_path: Path) -> None:
    p = tmp_path / "long.csv"
    p.write_text("x,note\n1," + "a" * (12 << 20) + "\n2,short\nnan,z\n")  # 3 arrow blocks
    r = nanguard.scan(p)
    assert r.rows == 3 and _cells(r) == [(2, "x", "nan")]
    assert next(c for c in r.columns if c.name == "note").skipped == "text column"


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--chunk-mb", "inf", "megabytes read per chunk"), ("--chunk-mb", "-5", "megabytes"),
    ("--chunk-mb", "nan", "megabytes"), ("--max-rows", "-1", "0 or more"),
    ("--max-rows", "x", "whole number"),
])
def test_scan_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  option: str, value: str, says: str) -> None:
    (tmp_path / "a.csv").write_text("a\n1\n")
    with pytest.raises(SystemExit) as info:
        cli_main(["scan", option, value, str(tmp_path / "a.csv")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {value!r}" in err and says in err and "Traceback" not in err


def _wide_csv(path: Path, cols: int, rows: int = 2) -> None:
    rng = np.random.default_rng(0)
    body = [",".join(f"c{j % 1000}" for j in range(cols))]  # repeated names: made unique
    for r in range(rows):
        vals = [f"{v:.4f}" for v in rng.standard_normal(cols)]
        if r == rows - 1:
            vals[-1], vals[cols // 2] = "nan", ""
        body.append(",".join(vals))
    path.write_text("\n".join(body) + "\n")


@pytest.mark.parametrize("cols", [3000, 20_000])  # arrow's parser, then Python's (WIDE columns)
def test_a_wide_csv_costs_a_few_vectorised_passes_not_one_per_column(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cols: int) -> None:
    """Linear time in cells: the per-cell work runs once per piece over all its cells, so the
    number of arrow compute calls does not grow with the columns (it was ~10 per column)."""
    import pyarrow.compute as pc

    calls = []
    trim = pc.utf8_trim_whitespace
    monkeypatch.setattr(pc, "utf8_trim_whitespace", lambda *a, **k: calls.append(1) or trim(*a, **k))
    p = tmp_path / "wide.csv"
    _wide_csv(p, cols)
    r = nanguard.scan(p)
    assert len(calls) == 1  # one piece
    assert r.rows == 2 and len(r.columns) == cols and len({c.name for c in r.columns}) == cols
    assert _cells(r) == [(1, f"c{(cols // 2) % 1000}#{cols // 2}", "missing"),
                         (1, f"c{(cols - 1) % 1000}#{cols - 1}", "nan")]


def test_python_and_arrow_csv_parsers_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nanguard.datascan import _csv

    p = tmp_path / "train.csv"
    p.write_text(CSV)
    q = tmp_path / "eu.csv"
    q.write_text("a;b;c\n1;2;3\n\n4;nan;6\n7;8;inf\n")

    def reports() -> list[dict[str, object]]:
        out = []
        for path, chunk in ((p, 1 << 20), (p, 1024), (q, 1024)):
            d = nanguard.scan(path, chunk_bytes=chunk).to_dict()
            d.pop("seconds")
            out.append(d)
        return out

    arrow = reports()
    monkeypatch.setattr(_csv, "_SLICE", 3)  # columns checked in groups of 3 cells' worth
    assert reports() == arrow
    monkeypatch.setattr(_csv, "WIDE", 1)  # and parsed by Python's csv module
    assert reports() == arrow
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(ScanError, match="data row 1 has 1 fields, the header 2"):
        nanguard.scan(tmp_path / "ragged.csv")
