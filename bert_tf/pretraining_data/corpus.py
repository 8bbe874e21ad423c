"""The embedded default corpus: English prose already on every machine, the standard library's docstrings.

The demo has to run offline on a fresh machine without shipping anyone's text, so the corpus is
generated at run time. Each `.py` file of the installed standard library (and, optionally, of the
installed packages) is parsed with `ast`, never imported; module, class and function docstrings are
cleaned of doctests, reST markup and code, and split into sentences.

Output format (the one BERT's data creation reads): one sentence per line, a blank line between
documents. A docstring with at least two sentences is a document; the one-sentence docstrings of a
module are gathered into one document of their own. The file walk is sorted and duplicates are
dropped in walk order, so the same Python gives the same bytes every time.

Its command line: python -m bert_tf.corpus.
"""

import ast
import contextlib
import hashlib
import multiprocessing
import os
import re
import sysconfig
import warnings

from bert_tf.runtime import io_utils

# Directories that hold test fixtures, vendored wheels or generated data rather than library prose.
SKIPPED_DIRS = frozenset(
    {
        "__pycache__",
        "test",
        "tests",
        "idle_test",
        "site-packages",
        "dist-packages",
        "_bundled",
        "lib-dynload",
        "node_modules",
    }
)
# Installed with requirements.txt at pinned versions, so the default corpus is the same on every
# install. Together with the standard library they give about 3 MB of prose.
DEFAULT_PACKAGES = ("numpy", "keras", "keras_hub")
MIN_SENTENCE_WORDS = 3
MAX_SENTENCE_CHARS = 1000
MIN_DOCUMENT_SENTENCES = 2


# reST and Sphinx markup that wraps ordinary words: keep the words, drop the markup.
_ROLE = re.compile(r":(?:[\w-]+:)*[\w-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`~os.path.join`
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_{1,2}")  # `text <url>`_
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"`([^`]+)`_{0,2}")
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}(?=\S)([^*]+?)(?<=\S)\*{1,2}(?![\w*])")
_FIELD = re.compile(r"^:[\w ]+?:\s*")  # :param x: ...
_URL = re.compile(r"\b(?:https?|ftp)://\S+")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_.:])\1{2,}$")  # ===== under a title
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATION = re.compile(r"\b(?:e\.g|i\.e|etc|vs|cf|Mr|Mrs|Dr|No|approx|incl|resp|Ex)\.$")
_CODE_START = re.compile(
    r"^(?:>>>|\.\.\.\s|\$ |#|@|def |class |import |from \S+ import |return\b|yield\b|raise |"
    r"if .*:$|for .*:$|while .*:$|with .*:$|try:|except\b|else:|elif |print\(|[\[{}\])])"
)
_SECTION_HEADER = re.compile(r"^([A-Z][A-Za-z ]{1,30}):$")
# An entry of an argument list: Google's "name: text", "name (type): text", "*args: text" ...
_GOOGLE_ENTRY = re.compile(
    r"^\*{0,2}[A-Za-z_][\w.]*(?:,\s*\*{0,2}[A-Za-z_][\w.]*)*\s*(?:\([^)]*\))?:(?:\s+|$)"
)
# ... and numpy's "name : type" line, which holds no prose at all.
_NUMPY_ENTRY = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*(?:,\s*\*{0,2}[A-Za-z_][\w.]*)*\s+:(?:\s|$)")
LIST_SECTIONS = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword arguments",
        "keyword args",
        "kwargs",
        "other parameters",
        "call arguments",
        "call args",
        "attributes",
        "returns",
        "return",
        "yields",
        "raises",
        "warns",
        "properties",
        "methods",
        "input shape",
        "output shape",
        "fields",
    }
)
SKIPPED_SECTIONS = frozenset(
    {
        "example",
        "examples",
        "example usage",
        "usage",
        "see also",
        "references",
        "reference",
        "standalone usage",
        "usage with compile() api",
        "sample usage",
        "for example",
    }
)
_IDENTIFIER_HEAVY = re.compile(r"[_(){}\[\]=<>|\\/@$%^&*;#]")


def corpus_source_dirs(packages=DEFAULT_PACKAGES):
    """The directories walked for docstrings: the standard library, then each named installed package.

    Packages are found as directories in site-packages (never imported); a missing one is a UsageError.
    """
    paths = sysconfig.get_paths()
    dirs = [paths["stdlib"]]
    site_dirs = list(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    for package in packages:
        found = [
            os.path.join(d, package) for d in site_dirs if os.path.isdir(os.path.join(d, package))
        ]
        if not found:
            raise io_utils.UsageError(
                f"package {package!r} is not installed in {' or '.join(site_dirs)}"
            )
        dirs.append(found[0])
    return dirs


def iter_python_files(root):
    """Yields the `.py` files under `root` in sorted order, skipping test and vendored directories."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py") and not (name.startswith("test_") or name.endswith("_test.py")):
                yield os.path.join(directory, name)


def iter_docstrings(source):
    """Yields the module, class and function docstrings of Python source text, in source order."""
    with warnings.catch_warnings():
        # Old files with invalid escape sequences warn on parse; they are still valid input.
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                yield docstring
        # Reversed so that popping visits children in source order.
        children = [
            c
            for c in ast.iter_child_nodes(node)
            if isinstance(c, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        stack.extend(reversed(children))


def strip_markup(line):
    """Removes reST roles, literals, links, emphasis and URLs from one line, keeping the words."""
    line = _LINK.sub(r"\1", line)
    line = _URL.sub("", line)
    line = _ROLE.sub(r"\1", line)
    line = _LITERAL.sub(r"\1", line)
    line = _INTERPRETED.sub(r"\1", line)
    line = _EMPHASIS.sub(r"\1", line)
    line = _FIELD.sub("", line)
    return line


def looks_like_code(line):
    """True for a line that is mostly code, a prompt, a table rule or a signature rather than prose."""
    stripped = line.strip()
    if not stripped or _CODE_START.match(stripped) or _UNDERLINE.match(stripped):
        return True
    if stripped.startswith("|") or stripped.startswith("+-"):
        return True  # reST tables
    letters = sum(c.isalpha() or c == " " for c in stripped)
    if letters < 0.8 * len(stripped):
        return True
    # Words glued with underscores, dots or brackets (os.path.join(a, b)) mark code in prose clothing.
    words = stripped.split()
    codeish = sum(1 for w in words if _IDENTIFIER_HEAVY.search(w.strip(".,:;")))
    return codeish > max(1, len(words) // 5)


def is_prose_sentence(sentence):
    """True for a whole sentence of prose: capitalized, closed by '.', '!' or '?', a few words, not code."""
    return (
        MIN_SENTENCE_WORDS <= len(sentence.split())
        and len(sentence) <= MAX_SENTENCE_CHARS
        and sentence[0].isupper()
        and sentence[-1] in ".!?"
        and not looks_like_code(sentence)
    )


def _section_name(line):
    """The lower-cased name of a Google-style section header ("Args:", "Returns:"), else None."""
    match = _SECTION_HEADER.match(line)
    return match.group(1).lower() if match else None


def paragraphs(docstring):
    """Splits a cleaned docstring into prose paragraphs.

    Drops doctests with their output, literal blocks (after '::'), directives, Examples / See Also
    sections and section headers; each entry of an Args / Returns / Raises list becomes its own
    paragraph with its "name (type):" prefix removed.
    """
    result = []
    current = []

    def flush():
        """Closes the current paragraph."""
        if current:
            result.append(list(current))
            current.clear()

    skip_indent = None  # inside a literal block or directive: skip lines indented deeper than this
    in_doctest = False  # inside a doctest: skip up to the next blank line
    section = None  # the current section's name; None in the free text
    for raw in docstring.splitlines():
        indent = len(raw) - len(raw.lstrip())
        stripped = raw.strip()
        if in_doctest:
            if stripped:
                continue
            in_doctest = False
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if not stripped:
            flush()
            continue
        if _UNDERLINE.match(stripped):
            # A numpy-style header is the line above its underline.
            section = current.pop().lower() if current else section
            flush()
            continue
        name = _section_name(stripped)
        if name is not None:
            flush()
            section = name
            continue
        if section in SKIPPED_SECTIONS:
            continue
        if stripped.startswith(">>>"):
            flush()
            in_doctest = True
            continue
        if stripped.startswith(".. "):
            # A directive (.. note::, .. versionadded:: 3.2) or comment; its indented body goes too.
            flush()
            skip_indent = indent
            continue
        if section in LIST_SECTIONS:
            if _NUMPY_ENTRY.match(stripped):
                flush()
                continue
            entry = _GOOGLE_ENTRY.match(stripped)
            if entry:
                # "x (int): The input." starts a new entry; keep only its prose.
                flush()
                stripped = stripped[entry.end() :].strip()
                if not stripped:
                    continue
        if stripped.endswith("::"):
            skip_indent = indent
            stripped = stripped[:-1] if stripped != "::" else ""
            if not stripped:
                continue
        current.append(stripped)
    flush()
    return result


def split_sentences(text):
    """Splits one paragraph of prose into sentences at '.', '!' or '?' followed by a capital or digit."""
    sentences = []
    pending = ""
    for piece in _SENTENCE_END.split(text):
        pending = f"{pending} {piece}".strip() if pending else piece.strip()
        if _ABBREVIATION.search(pending):
            continue  # "e.g. Foo" is not a sentence end
        sentences.append(pending)
        pending = ""
    if pending:
        sentences.append(pending)
    return sentences


def docstring_sentences(docstring):
    """The clean prose sentences of one docstring."""
    sentences = []
    for paragraph in paragraphs(docstring):
        lines = [strip_markup(line) for line in paragraph]
        lines = [line for line in lines if not looks_like_code(line)]
        text = " ".join(" ".join(lines).split())
        for sentence in split_sentences(text):
            if is_prose_sentence(sentence):
                sentences.append(sentence)
    return sentences


def file_documents(path):
    """The documents (lists of sentences) of one source file; unreadable or unparsable files give none."""
    try:
        with open(path, "rb") as f:
            source = f.read()
        docstrings = list(iter_docstrings(source))
    except (SyntaxError, ValueError, UnicodeDecodeError, OSError, RecursionError):
        return []
    documents = []
    one_liners = []
    for docstring in docstrings:
        sentences = docstring_sentences(docstring)
        if len(sentences) >= MIN_DOCUMENT_SENTENCES:
            documents.append(sentences)
        else:
            one_liners.extend(sentences)
    if len(one_liners) >= MIN_DOCUMENT_SENTENCES:
        documents.append(one_liners)
    return documents


def iter_default_documents(roots=None, processes=1):
    """Yields the default corpus's documents (lists of sentences) in a fixed order, duplicates dropped.

    `roots` defaults to `corpus_source_dirs()`. With `processes` > 1 the files are parsed in worker
    processes; the order, and so the output, stays the same.
    """
    if roots is None:
        roots = corpus_source_dirs()
    paths = [path for root in roots for path in iter_python_files(root)]
    seen = set()
    with contextlib.ExitStack() as stack:
        if processes > 1:
            # fork: the workers only parse Python source, and re-importing TensorFlow would cost seconds.
            pool = stack.enter_context(multiprocessing.get_context("fork").Pool(processes))
            per_file = pool.imap(file_documents, paths, chunksize=16)
        else:
            per_file = map(file_documents, paths)
        for documents in per_file:
            for document in documents:
                digest = hashlib.sha1("\n".join(document).encode("utf-8")).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                yield document


def is_heldout(index, heldout_every):
    """Whether document `index` (0-based, in corpus order) is held out: every `heldout_every`-th one."""
    return bool(heldout_every) and (index + 1) % heldout_every == 0


def write_default_corpus(
    output_file, max_bytes=None, roots=None, processes=1, heldout_file=None, heldout_every=0
):
    """Writes the default corpus to `output_file` atomically; returns counts of documents, sentences, bytes.

    With `heldout_file`, every `heldout_every`-th document goes there instead (counted under
    "heldout_documents"), so a model trained on `output_file` can be asked about text it never saw.
    `max_bytes` bounds `output_file` alone.
    """
    if bool(heldout_file) != bool(heldout_every):
        raise ValueError("heldout_file and heldout_every go together")
    stats = {"documents": 0, "sentences": 0, "bytes": 0, "heldout_documents": 0}
    with contextlib.ExitStack() as stack:
        f = open(stack.enter_context(io_utils.atomic_path(output_file)), "wb")
        stack.callback(f.close)
        heldout = None
        if heldout_file:
            heldout = open(stack.enter_context(io_utils.atomic_path(heldout_file)), "wb")
            stack.callback(heldout.close)
        documents = iter_default_documents(roots, processes=processes)
        for index, document in enumerate(documents):
            block = ("\n".join(document) + "\n\n").encode("utf-8")
            if is_heldout(index, heldout_every):
                heldout.write(block)
                stats["heldout_documents"] += 1
                continue
            if max_bytes is not None and stats["bytes"] + len(block) > max_bytes:
                break
            f.write(block)
            stats["documents"] += 1
            stats["sentences"] += len(document)
            stats["bytes"] += len(block)
    return stats


def repeat_corpus(src, dst, target_bytes):
    """Writes `src` repeated whole (then cut at a document boundary) until `dst` holds ~`target_bytes`.

    Benchmarks need 10 MB or 100 MB corpora; repeating the real text keeps its statistics.
    Returns the number of bytes written.
    """
    with open(src, "rb") as f:
        data = f.read()
    if not data.strip():
        raise io_utils.UsageError(f"cannot repeat an empty corpus: {src}")
    if not data.endswith(b"\n\n"):
        data = data.rstrip(b"\n") + b"\n\n"  # keep a document boundary between copies
    written = 0
    with io_utils.atomic_path(dst) as tmp:
        with open(tmp, "wb") as f:
            while written + len(data) <= target_bytes:
                f.write(data)
                written += len(data)
            remaining = target_bytes - written
            if remaining > 0:
                cut = data.rfind(b"\n\n", 0, remaining)
                if cut > 0:
                    f.write(data[: cut + 2])
                    written += cut + 2
            if written == 0:
                # The source alone is bigger than the target: write one copy rather than nothing.
                f.write(data)
                written = len(data)
    return written
