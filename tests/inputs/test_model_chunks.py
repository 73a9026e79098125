"""Model chunks of one rank (Megatron's virtual pipeline, loaders/joining.split_chunks)."""
from pathlib import Path

from dumpcompare.loaders.joining import split_chunks
from dumpcompare.records import Dump, Entry


def _dump(paths: list[str]) -> Dump:
    entries = [Entry(f"Module.{p}.M.forward.0", i, "module", p, "M", "forward", 0) for i, p in enumerate(paths)]
    return Dump(Path("d/dump.json"), Path("d"), "msprobe", "statistics", "L0", "pytorch", None, entries)


def test_each_chunk_is_split_with_its_index_dropped():
    d = _dump(["0.embedding", "0.decoder.layers.0.mlp", "0.decoder", "1.decoder.layers.0.mlp", "1.decoder",
               "1.output_layer"])
    (c0, a), (c1, b) = split_chunks(d)
    assert (c0, c1) == (0, 1)
    assert [e.raw_path for e in a.entries] == ["embedding", "decoder.layers.0.mlp", "decoder"]
    assert [e.raw_path for e in b.entries] == ["decoder.layers.0.mlp", "decoder", "output_layer"]
    assert b.entries[0].key == "Module.decoder.layers.0.mlp.M.forward.0" and b.entries[0].order == 0
    assert [e.raw_path for e in d.entries][0] == "0.embedding"          # the loaded dump is not changed


def test_one_chunk_or_numbered_children_without_layers_stay_one_model():
    one = _dump(["0.module.module.embedding", "0.module.module.decoder.layers.0.mlp"])
    assert split_chunks(one) == [(0, one)]
    sequential = _dump(["0.tok", "1.layers.0.mlp", "2.proj"])      # an nn.Sequential's items
    assert split_chunks(sequential) == [(0, sequential)]
