"""Shards written and read by the real MosaicML Streaming and webdataset packages, for
tests/data/streaming.rs.

    streaming_shards.py write-mds OUT      MDS with every column encoding Tessera reads, plain
                                           (OUT/plain) and zstd-compressed (OUT/zstd), and
                                           OUT/expected.json: every sample's values.
    streaming_shards.py write-wds OUT      WebDataset shards OUT/shard-00000{0,1,2}.tar of
                                           PNG images with cls labels, and OUT/expected.json.
    streaming_shards.py read-mds DIR       Prints JSON: the samples of DIR read with
                                           StreamingDataset (image bytes as sha256, labels).
    streaming_shards.py read-wds PATTERN   The same, read with webdataset.
    streaming_shards.py write-text DIR     DIR/src/{train,val}/*.txt (sorted by name, one
                                           sample each) as MDS text shards DIR/mds/{train,val}
                                           (columns id: int, text: str; zstd; 8 KB shards).
"""

import hashlib
import json
import sys

import numpy as np
from PIL import Image

SAMPLES = 23
SIZE = 8


def image(rng):
    return Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8), "RGB")


def array_json(a):
    return {"dtype": a.dtype.name, "shape": list(a.shape), "values": a.ravel().tolist()}


def write_mds(out):
    from streaming import MDSWriter
    from streaming.base.format.mds.encodings import mds_encode

    columns = {
        "b": "bytes", "s": "str", "i": "int", "j": "json",
        "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
        "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
        "f16": "float16", "f32": "float32", "f64": "float64",
        "si": "str_int", "sf": "str_float",
        "nd": "ndarray", "ndt": "ndarray:int16", "ndf": "ndarray:uint8:8,8,3",
        "jpeg": "jpeg", "png": "png", "pil": "pil", "y": "int",
    }
    rng = np.random.default_rng(7)
    samples = []
    for k in range(SAMPLES):
        dtype = ["uint8", "int32", "float32", "float64", "uint16"][k % 5]
        shape = [(3,), (2, 5), (4, 1, 3), (300,), (1,)][k % 5]
        nd = (rng.standard_normal(shape) * 100).astype(dtype)
        pic = image(rng)
        samples.append({
            "b": bytes(rng.integers(0, 256, k % 7, dtype=np.uint8)),
            "s": "sample %d: ünïcode ✓" % k * (k % 3),
            "i": int(rng.integers(-2**62, 2**62)),
            "j": {"k": k, "list": [1, 2.5, "x"]},
            "u8": int(rng.integers(0, 256)), "u16": int(rng.integers(0, 2**16)),
            "u32": int(rng.integers(0, 2**32)), "u64": int(rng.integers(0, 2**62)),
            "i8": int(rng.integers(-128, 128)), "i16": int(rng.integers(-2**15, 2**15)),
            "i32": int(rng.integers(-2**31, 2**31)), "i64": int(rng.integers(-2**62, 2**62)),
            "f16": float(np.float16(rng.standard_normal())),
            "f32": float(np.float32(rng.standard_normal())),
            "f64": float(rng.standard_normal()),
            "si": int(rng.integers(-10**12, 10**12)), "sf": float(rng.standard_normal()),
            "nd": nd, "ndt": rng.integers(-300, 300, (k % 4 + 1, 2)).astype(np.int16),
            "ndf": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
            "jpeg": pic, "png": image(rng), "pil": image(rng),
            "y": k % 10,
        })
    for name, compression in [("plain", None), ("zstd", "zstd:7")]:
        with MDSWriter(out=f"{out}/{name}", columns=columns, compression=compression,
                       hashes=["sha1", "xxh64"], size_limit=8000) as w:
            for s in samples:
                w.write(s)
    expected = []
    for s in samples:
        e = {}
        for key, enc in columns.items():
            v = s[key]
            if enc in ("jpeg", "png", "pil", "bytes"):
                e[key] = {"bytes": mds_encode(enc, v).hex()}
                if enc != "bytes":
                    e[key]["pixels"] = np.asarray(Image.open(__import__("io").BytesIO(
                        mds_encode(enc, v))) if enc != "pil" else v).transpose(2, 0, 1).ravel().tolist()
            elif enc.startswith("ndarray"):
                e[key] = array_json(v)
            elif enc == "json":
                e[key] = json.dumps(v)
            else:
                e[key] = v
        expected.append(e)
    with open(f"{out}/expected.json", "w") as f:
        json.dump(expected, f)


def write_wds(out):
    import io

    import webdataset as wds

    rng = np.random.default_rng(11)
    expected = []
    with wds.ShardWriter(f"{out}/shard-%06d.tar", maxcount=10) as w:
        for k in range(SAMPLES):
            pic = image(rng)
            buf = io.BytesIO()
            pic.save(buf, format="PNG")
            w.write({"__key__": "dir/s%04d" % k, "png": buf.getvalue(), "cls": k % 10,
                     "txt": "text %d" % k})
            expected.append({"label": k % 10,
                             "pixels": np.asarray(pic).transpose(2, 0, 1).ravel().tolist()})
    with open(f"{out}/expected.json", "w") as f:
        json.dump(expected, f)


def write_text(out):
    import pathlib

    from streaming import MDSWriter

    for part in ("train", "val"):
        files = sorted(pathlib.Path(out, "src", part).glob("*.txt"))
        with MDSWriter(out=f"{out}/mds/{part}", columns={"id": "int", "text": "str"},
                       compression="zstd", size_limit=8000) as w:
            for k, f in enumerate(files):
                w.write({"id": k, "text": f.read_text(encoding="utf-8")})


def read_mds(path):
    from streaming import StreamingDataset

    ds = StreamingDataset(local=path, shuffle=False, batch_size=1)
    out = []
    for i in range(len(ds)):
        s = ds[i]
        if "text" in s:
            out.append({"text": s["text"]})
            continue
        x = s["x"]
        if isinstance(x, np.ndarray):
            out.append({"label": int(s["y"]), "array": x.ravel().tolist(), "shape": list(x.shape)})
        else:
            out.append({"label": int(s["y"]), "size": list(x.size), "mode": x.mode,
                        "pixels_sha256": hashlib.sha256(np.asarray(x).tobytes()).hexdigest()})
    print(json.dumps(out))


def read_wds(pattern):
    import webdataset as wds

    out = []
    for s in wds.WebDataset(pattern, shardshuffle=False):
        item = {"key": s["__key__"]}
        for ext in ("jpg", "png"):
            if ext in s:
                item["image_sha256"] = hashlib.sha256(s[ext]).hexdigest()
        if "cls" in s:
            item["label"] = int(s["cls"].decode())
        if "txt" in s:
            item["text"] = s["txt"].decode()
        out.append(item)
    print(json.dumps(out))


if __name__ == "__main__":
    {"check": lambda _: None, "write-mds": write_mds, "write-wds": write_wds, "read-mds": read_mds,
     "read-wds": read_wds, "write-text": write_text}[sys.argv[1]](sys.argv[2])
