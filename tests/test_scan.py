"""`nanguard.scan` / `nanguard scan`: every format, chunk boundaries, exit codes, a >1 GB file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import nanguard
from nanguard.cli import main as cli_main
from nanguard.datascan import ScanReport

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
    r = nanguard.scan(p)
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
        r = nanguard.scan(p, chunk_bytes=chunk)
        assert _cells(r) == [(17, "[:, 1]", "nan"), (500, "[:, 0]", "fp16"), (9999, "[:, 3]", "+inf")]
    assert not nanguard.scan(p, fp16=False).columns[0].issues(False)
    pf = tmp_path / "f.npy"
    np.save(pf, np.asfortranarray(a))
    assert _cells(nanguard.scan(pf, chunk_bytes=1024)) == _cells(r)


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
    r = nanguard.scan(p, chunk_bytes=2048)
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
    code = textwrap.dedent(f"""
        import os, torch
        class Evil:
            def __reduce__(self):
                return (os.system, ("touch {marker}",))
        torch.save({{"x": Evil()}}, {str(evil)!r})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
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

    ri = nanguard.scan(Items())
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
    assert cli_main(["scan", str(tmp_path / "big.npy")]) == 3
    assert cli_main(["scan", "--no-fp16", str(tmp_path / "big.npy")]) == 0
    assert cli_main(["scan", str(tmp_path / "missing.csv")]) == 2
    (tmp_path / "x.txt").write_text("hi")
    assert cli_main(["scan", str(tmp_path / "x.txt")]) == 2
    capsys.readouterr()


@pytest.mark.slow
def test_a_file_larger_than_1gb_streams_in_bounded_memory(tmp_path: Path) -> None:
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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rows"] == rows
    assert [tuple(c) for c in res["cells"]] == [(3_000_123, "[:, 5]", "nan"),
                                                (4_299_999, "[:, 63]", "+inf")]
    assert res["growth_mb"] < 200, res  # measured: ~35 MB for 1.1 GB
    assert res["seconds"] < 60, res
