"""Tests for the embedded default corpus (bert_tf.corpus)."""

import os
import textwrap

import pytest
from helpers import run_module_cli

from bert_tf import corpus as corpus_cli
from bert_tf.pretraining_data import corpus
from bert_tf.runtime import io_utils

MODULE_SOURCE = textwrap.dedent('''
    """Tools for counting apples in baskets.

    The counting is exact. Baskets may be nested, e.g. Basket objects inside baskets.
    """
    raise SystemExit("parsing must never run this module")


    def count(basket):
        """Counts the apples in a basket.

        Use :func:`~apples.count` for one basket and ``count_all`` for many.
        See `the guide <https://example.com/guide>`_ for details.

        >>> count(Basket(3))
        3
        >>> count(Basket(0))
        0

        Args:
            basket (Basket): The basket whose apples are counted.
            strict: Whether to fail on pears.

        Returns:
            The number of apples found.

        Example::

            total = sum(count(b) for b in baskets)

        .. versionadded:: 3.2
           Nested baskets are counted too.
        """


    class Basket:
        """Holds the apples."""

        def weigh(self):
            """Weighs the basket."""

        def empty(self):
            """Empties the basket. Nothing is returned to the caller."""
''')


def write(path, text):
    """Writes text to a new file, creating directories."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_docstrings_are_read_with_ast_in_source_order():
    docstrings = list(corpus.iter_docstrings(MODULE_SOURCE))
    assert [d.split("\n")[0] for d in docstrings] == [
        "Tools for counting apples in baskets.",
        "Counts the apples in a basket.",
        "Holds the apples.",
        "Weighs the basket.",
        "Empties the basket. Nothing is returned to the caller.",
    ]


def test_docstring_sentences_drop_doctests_markup_code_and_sections():
    docstring = list(corpus.iter_docstrings(MODULE_SOURCE))[1]
    assert corpus.docstring_sentences(docstring) == [
        "Counts the apples in a basket.",
        "Use apples.count for one basket and count_all for many.",
        "See the guide for details.",
        "The basket whose apples are counted.",
        "Whether to fail on pears.",
        "The number of apples found.",
    ]


def test_sentence_split_keeps_abbreviations_together():
    assert corpus.split_sentences(
        "Baskets may be nested, e.g. Basket objects. Then stop! Why? 3 more."
    ) == [
        "Baskets may be nested, e.g. Basket objects.",
        "Then stop!",
        "Why?",
        "3 more.",
    ]


@pytest.mark.parametrize(
    "line, is_code",
    [
        ("The number of apples found.", False),
        ("total = sum(count(b) for b in baskets)", True),
        ("def count(basket):", True),
        ("==========", True),
        ("x_value, y_value, z_value = f(a_b, c_d)", True),
        ("Returns the sum of the values in the array.", False),
    ],
)
def test_looks_like_code(line, is_code):
    assert corpus.looks_like_code(line) is is_code


def test_file_documents_group_one_liners_and_skip_unparsable(tmp_path):
    good = tmp_path / "apples.py"
    good.write_text(MODULE_SOURCE, encoding="utf-8")
    documents = corpus.file_documents(str(good))
    assert documents[0] == [
        "Tools for counting apples in baskets.",
        "The counting is exact.",
        "Baskets may be nested, e.g. Basket objects inside baskets.",
    ]
    assert documents[2] == ["Empties the basket.", "Nothing is returned to the caller."]
    # The one-sentence docstrings of the module become one document of their own, at the end.
    assert documents[3:] == [["Holds the apples.", "Weighs the basket."]]
    bad = tmp_path / "py2.py"
    bad.write_text('print "not python 3"\n', encoding="utf-8")
    assert corpus.file_documents(str(bad)) == []


def make_tree(root):
    """A small source tree: two modules, a duplicate, a test directory and a test file to skip."""
    write(os.path.join(root, "pkg", "apples.py"), MODULE_SOURCE)
    write(os.path.join(root, "pkg", "copy_of_apples.py"), MODULE_SOURCE)
    write(
        os.path.join(root, "pkg", "pears.py"),
        '"""Pears ripen slowly. Keep them cool. Eat them soon."""\n',
    )
    write(
        os.path.join(root, "pkg", "tests", "ignored.py"),
        '"""Test fixtures are skipped. They are not prose."""\n',
    )
    write(
        os.path.join(root, "pkg", "apples_test.py"),
        '"""Test modules are skipped. They are not prose."""\n',
    )


def read_documents(path):
    """Parses the corpus format back: documents separated by a blank line, one sentence a line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n\n") and "\n\n\n" not in text
    return [block.split("\n") for block in text[:-2].split("\n\n")]


def test_write_default_corpus_format_dedup_and_determinism(tmp_path):
    make_tree(str(tmp_path / "src"))
    out1, out2 = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    stats = corpus.write_default_corpus(out1, roots=[str(tmp_path / "src")])
    corpus.write_default_corpus(out2, roots=[str(tmp_path / "src")], processes=2)
    with open(out1, "rb") as f1, open(out2, "rb") as f2:
        assert f1.read() == f2.read()
    documents = read_documents(out1)
    assert stats["documents"] == len(documents)
    assert stats["sentences"] == sum(len(d) for d in documents)
    assert stats["bytes"] == os.path.getsize(out1)
    text = "\n".join(s for d in documents for s in d)
    assert "Pears ripen slowly." in text
    assert "skipped" not in text
    # The copied module adds nothing: each document appears once.
    assert len({tuple(d) for d in documents}) == len(documents)
    assert all(len(d) >= corpus.MIN_DOCUMENT_SENTENCES for d in documents)


def test_max_bytes_stops_at_a_document_boundary(tmp_path):
    make_tree(str(tmp_path / "src"))
    full = corpus.write_default_corpus(str(tmp_path / "full.txt"), roots=[str(tmp_path / "src")])
    cut = corpus.write_default_corpus(
        str(tmp_path / "cut.txt"), max_bytes=full["bytes"] - 1, roots=[str(tmp_path / "src")]
    )
    assert cut["documents"] == full["documents"] - 1
    assert os.path.getsize(tmp_path / "cut.txt") == cut["bytes"] < full["bytes"]


def test_standard_library_corpus_is_clean_prose(tmp_path):
    out = str(tmp_path / "stdlib.txt")
    stats = corpus.write_default_corpus(out, max_bytes=200_000, roots=corpus.corpus_source_dirs(()))
    assert 150_000 < stats["bytes"] <= 200_000
    documents = read_documents(out)
    sentences = [s for d in documents for s in d]
    assert len(sentences) > 1000
    for sentence in sentences:
        assert corpus.is_prose_sentence(sentence), sentence
        assert not sentence.startswith(">>>") and "``" not in sentence and ":func:" not in sentence


def test_corpus_source_dirs_names_a_missing_package():
    with pytest.raises(io_utils.UsageError, match="no_such_package_xyz"):
        corpus.corpus_source_dirs(("no_such_package_xyz",))
    assert corpus.corpus_source_dirs(("numpy",))[1].endswith("numpy")


def test_repeat_corpus_reaches_the_target_at_document_boundaries(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("One sentence here.\nTwo sentences here.\n\nAnother document.\nIts end.\n\n")
    dst = str(tmp_path / "big.txt")
    size = src.stat().st_size
    first_document = b"One sentence here.\nTwo sentences here.\n\n"
    written = corpus.repeat_corpus(str(src), dst, 3 * size + len(first_document) + 5)
    data = (tmp_path / "big.txt").read_bytes()
    assert written == len(data)
    # Three whole copies, then the one document that still fits.
    assert data == src.read_bytes() * 3 + first_document
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(io_utils.UsageError, match="empty.txt"):
        corpus.repeat_corpus(str(empty), dst, 100)


def run_cli(*args):
    """Runs `python -m bert_tf.corpus` as a real subprocess."""
    return run_module_cli("bert_tf.corpus", *args)


def test_cli_writes_the_corpus_and_reports_it(tmp_path):
    out = tmp_path / "corpus.txt"
    result = run_cli(f"--output_file={out}", "--max_mb=0.05", "--packages=", "--num_workers=1")
    assert result.returncode == 0, result.stderr
    assert "documents" in result.stdout and "sentences" in result.stdout and "MB" in result.stdout
    assert 0 < out.stat().st_size <= 50_000


def test_cli_usage_errors_exit_2(tmp_path):
    result = run_cli(f"--output_file={tmp_path / 'c.txt'}", "--packages=no_such_package_xyz")
    assert result.returncode == 2
    assert "no_such_package_xyz" in result.stderr
    assert not (tmp_path / "c.txt").exists()


def test_every_nth_document_is_held_out_and_the_rest_is_the_corpus(tmp_path):
    src = str(tmp_path / "src")
    make_tree(src)
    for name in ("figs", "plums", "limes", "dates"):
        write(
            os.path.join(src, "pkg", f"{name}.py"),
            f'"""{name.title()} are sweet. Wash the {name} first. Keep {name} dry."""\n',
        )
    corpus.write_default_corpus(str(tmp_path / "full.txt"), roots=[src])
    full = read_documents(tmp_path / "full.txt")
    stats = corpus.write_default_corpus(
        str(tmp_path / "train.txt"),
        roots=[src],
        heldout_file=str(tmp_path / "heldout.txt"),
        heldout_every=3,
    )
    assert len(full) >= 6
    assert read_documents(tmp_path / "heldout.txt") == full[2::3]
    assert read_documents(tmp_path / "train.txt") == [d for i, d in enumerate(full) if i % 3 != 2]
    assert (stats["documents"], stats["heldout_documents"]) == (
        len(full) - len(full) // 3,
        len(full) // 3,
    )
    args = corpus_cli.CorpusArgs(
        output_file=str(tmp_path / "c.txt"),
        heldout_file=str(tmp_path / "h.txt"),
        heldout_every=1,
    )
    with pytest.raises(io_utils.UsageError, match="--heldout_every must be at least 2"):
        corpus_cli.run(args)
    assert not (tmp_path / "c.txt").exists()
