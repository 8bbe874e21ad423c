"""The requests each export kind's benchmark rows send, made from real sentences.

bench_inference's rows and their Hugging Face peer (hf_peer.py, in an interpreter without
TensorFlow) build the same request from the same sentence, so that both sides run the same text:
  - classifier and ner: the sentence itself (`text`);
  - squad: a question made of the sentence's first words, and the sentence as the context;
  - multiple_choice: the sentence as the context, and NUM_ENDINGS endings made of its words (every
    NUM_ENDINGS-th word, from the first, second, ... on).
"""

NUM_ENDINGS = 4
QUESTION_WORDS = 4
KINDS = ("classifier", "ner", "squad", "multiple_choice")


def question(sentence):
    """A question about `sentence`: its first QUESTION_WORDS words and a question mark."""
    return " ".join(sentence.split()[:QUESTION_WORDS]) + "?"


def endings(sentence):
    """NUM_ENDINGS endings of `sentence`'s own words (the whole sentence where it is too short)."""
    words = sentence.split()
    return [" ".join(words[i::NUM_ENDINGS]) or sentence for i in range(NUM_ENDINGS)]


def request(kind, sentences):
    """{input name: list} of the export of `kind` for `sentences` (one row each)."""
    if kind in ("classifier", "ner"):
        return {"text": list(sentences)}
    if kind == "squad":
        return {"question": [question(s) for s in sentences], "context": list(sentences)}
    if kind == "multiple_choice":
        return {"context": list(sentences), "endings": [endings(s) for s in sentences]}
    raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
