"""fusebox_tools.models.minilm_embed's client rules that need neither a GPU nor the tokenizers package
(issue 36): the max_seq_length read from the model folder as sentence-transformers reads it, and
the length buckets (sorted, batched, each padded to its own longest, input order restorable)."""
import json
import os

import numpy as np
import pytest

from fusebox_tools.models import minilm_embed as me

CFG = {"max_pos": 512}


def _folder(tmp_path, where=None, content=None):
    model = tmp_path / "minilm" / "fusebox"
    (model / "host").mkdir(parents=True)
    if where is not None:
        d = {"model": model, "host": model / "host", "hf": tmp_path / "minilm" / "hf"}[where]
        d.mkdir(parents=True, exist_ok=True)
        (d / me.SBERT_CONFIG).write_text(content if isinstance(content, str) else json.dumps(content))
    return str(model)


@pytest.mark.parametrize("where", ["model", "host", "hf"])
def test_max_seq_length_comes_from_sentence_bert_config(tmp_path, where):
    model = _folder(tmp_path, where, {"max_seq_length": 256, "do_lower_case": False})
    n, src = me.max_seq_length(model, CFG)
    assert n == 256 and src.endswith(me.SBERT_CONFIG)


def test_max_seq_length_falls_back_to_max_positions_only_when_absent(tmp_path):
    model = _folder(tmp_path)
    n, src = me.max_seq_length(model, CFG)
    assert n == 512 and "max_position_embeddings" in src
    # a config without the key: the positions too
    model = _folder(tmp_path / "b", "host", {"do_lower_case": False})
    assert me.max_seq_length(model, CFG)[0] == 512


def test_max_seq_length_is_at_most_the_positions_and_rejects_bad_values(tmp_path):
    assert me.max_seq_length(_folder(tmp_path / "a", "host", {"max_seq_length": 4096}), CFG)[0] == 512
    with pytest.raises(ValueError, match="not a positive integer"):
        me.max_seq_length(_folder(tmp_path / "b", "host", {"max_seq_length": 0}), CFG)
    with pytest.raises(ValueError, match="not a positive integer"):
        me.max_seq_length(_folder(tmp_path / "c", "host", {"max_seq_length": "256"}), CFG)
    with pytest.raises(ValueError, match="not a sentence-transformers config"):
        me.max_seq_length(_folder(tmp_path / "d", "host", "{not json"), CFG)


def test_the_folder_itself_wins_over_host_and_hf(tmp_path):
    model = _folder(tmp_path, "hf", {"max_seq_length": 128})
    assert me.max_seq_length(model, CFG)[0] == 128
    with open(os.path.join(model, me.SBERT_CONFIG), "w") as f:
        json.dump({"max_seq_length": 64}, f)
    assert me.max_seq_length(model, CFG)[0] == 64


def test_length_buckets_sort_batch_and_pad_each_to_its_longest():
    lengths = [5, 300, 12, 40, 7, 40, 256, 3]
    buckets = me.length_buckets(lengths, 3, max_positions=512)
    idx = [b[0].tolist() for b in buckets]
    # longest first, ties in input order (3 before 5), batches of 3
    assert idx == [[1, 6, 3], [5, 2, 4], [0, 7]]
    # each batch padded to its own longest, rounded up to SEQ_STEP
    assert [S for _, S in buckets] == [304, 48, 16]
    for ix, S in buckets:
        assert max(lengths[i] for i in ix) <= S < max(lengths[i] for i in ix) + me.SEQ_STEP
    # every sentence once: results put at the indices come back in input order
    flat = np.concatenate([b[0] for b in buckets])
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    out = np.zeros(len(lengths))
    for ix, _ in buckets:
        out[ix] = np.asarray(lengths)[ix]  # stand-in for the batch's embeddings
    assert out.tolist() == lengths


def test_length_buckets_single_batch_and_position_cap():
    buckets = me.length_buckets([10, 2, 600], 32, max_positions=512)
    assert len(buckets) == 1 and buckets[0][0].tolist() == [2, 0, 1] and buckets[0][1] == 512

