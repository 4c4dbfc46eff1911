"""minitx.data: ListOps evaluator, sentiment label rules, IMDB loader, tokenizer, seq2seq tasks."""
import numpy as np
import pytest

from minitx.data import (CharVocab, Vocab, evaluate_listops, generate_listops, generate_reviews,
                         listops_dataset, load_imdb, pad_sequences, rule_label, seq2seq_split,
                         stdlib_corpus, strip_special, task_output, tokenize)


@pytest.mark.parametrize("expr,value", [
    ("7", 7),
    ("[MAX 2 9 0 ]", 9),
    ("[MIN 4 7 ]", 4),
    ("[SM 3 8 ]", 1),                         # 11 mod 10
    ("[MED 1 4 ]", 2),                        # median 2.5 rounded down
    ("[MED 5 1 3 ]", 3),
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[SM 3 8 [MED 1 4 ] ]", 3),              # 3 + 8 + 2 = 13
    ("[MIN [MAX 1 2 ] [MAX 0 [SM 5 5 ] ] ]", 0),
    ("[MAX [MIN 9 [SM 6 7 ] ] 2 ]", 3),       # SM 6 7 = 3, MIN 9 3 = 3, MAX 3 2 = 3
])
def test_listops_evaluator(expr, value):
    assert evaluate_listops(expr) == value
    assert evaluate_listops(expr.split()) == value


@pytest.mark.parametrize("bad", ["[MAX 1 2", "[MAX 1 2 ] ]", "[FOO 1 ]", "[MAX ]", "1 2", ""])
def test_listops_rejects_malformed(bad):
    with pytest.raises(ValueError):
        evaluate_listops(bad)


def test_listops_generator_lengths_and_labels():
    items = generate_listops(50, 30, 80, seed=3)
    for toks, value in items:
        assert 30 <= len(toks) <= 80
        assert evaluate_listops(toks) == value
    ids, labels = listops_dataset(20, 10, 40, seed=1)
    assert ids.shape == (20, 41) and labels.shape == (20,)
    assert set(np.unique(labels)) <= set(range(10))


@pytest.mark.parametrize("text,label", [
    ("the movie was good", 1),
    ("the movie was not good", 0),
    ("the movie was not really good", 0),
    ("the plot was good but boring", 0),
    ("the plot was boring but good", 1),
    ("the plot was boring but not bad", 1),
    ("the plot was not bad but dull", 0),
    ("i had popcorn , the cast seemed awful , i saw it on sunday", 0),
])
def test_sentiment_rules(text, label):
    assert rule_label(text) == label


def test_sentiment_generator_follows_rules_and_needs_order():
    items = generate_reviews(500, seed=0)
    assert all(rule_label(t) == y for t, y in items)
    # roughly balanced labels: if the 500 labels were fair coin flips the standard error would
    # be √(0.25/500) ≈ 0.022, so ±0.15 is ~7 of them; it catches a generator stuck on one class
    assert 0.35 < np.mean([y for _, y in items]) < 0.65
    # negation and contrast actually occur, with both labels for the same adjective
    assert any(" not " in t for t, _ in items) and any(" but " in t for t, _ in items)
    good = {y for t, y in items if "good" in t.split()}
    assert good == {0, 1}
    assert generate_reviews(5, seed=1) == generate_reviews(5, seed=1)


def test_imdb_loader_on_fake_folder(tmp_path):
    for split in ("train", "test"):
        for sub, texts in (("pos", ["A great film.", "Loved it<br />truly"]),
                           ("neg", ["Awful.", "Boring plot", "Bad acting"])):
            d = tmp_path / split / sub
            d.mkdir(parents=True)
            for i, t in enumerate(texts):
                (d / f"{i}_7.txt").write_text(t, encoding="utf-8")
    train = load_imdb(tmp_path, "train")
    assert len(train) == 5
    assert sorted(y for _, y in train) == [0, 0, 0, 1, 1]
    assert ("A great film.", 1) in train and ("Awful.", 0) in train
    assert len(load_imdb(tmp_path, "test", max_per_class=1)) == 2
    with pytest.raises(FileNotFoundError):
        load_imdb(tmp_path / "nope", "train")
    with pytest.raises(ValueError):
        load_imdb(tmp_path, "valid")


def test_tokenizer_round_trip():
    texts = ["The movie was not good, but fun!", "i had popcorn"]
    vocab = Vocab.build(texts)
    assert vocab.itos[:5] == ["<pad>", "<unk>", "<bos>", "<eos>", "<cls>"]
    ids = vocab.encode(texts[0])
    assert vocab.decode(ids) == " ".join(tokenize(texts[0]))
    assert tokenize("Not good, BUT fun!") == ["not", "good", ",", "but", "fun", "!"]
    assert vocab.encode("zebra") == [vocab.unk_id]
    text = "def f(x):\n    return x"
    cv = CharVocab(text)
    assert cv.decode(cv.encode(text)) == text


def test_seq2seq_tasks_and_heldout():
    (xtr, ytr), (xte, yte) = seq2seq_split("reverse", 300, 50, vocab=6, min_len=2, max_len=5)
    train_set = {tuple(strip_special(r)) for r in xtr}
    assert not any(tuple(strip_special(r)) in train_set for r in xte)
    for src, tgt in zip(xte, yte):
        assert strip_special(tgt) == strip_special(src)[::-1]
    assert task_output("sort", [3, 1, 2]) == [1, 2, 3]
    assert task_output("copy", [3, 1]) == [3, 1]


def test_stdlib_corpus_and_padding():
    text = stdlib_corpus(5000)
    assert len(text) == 5000 and all(c == "\n" or 32 <= ord(c) < 127 for c in text)
    assert pad_sequences([[1, 2, 3], [4]], 0).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad_sequences([[1, 2, 3]], 0, 2).tolist() == [[1, 2]]
