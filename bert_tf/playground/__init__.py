"""See what BERT sees: a local web page over the project's own code (`python -m bert_tf.playground`).

Six views, each answered by the real Python code, never by a re-implementation in the page:
input representation, MLM masking, next sentence, fill-mask, records and attention.

    views.py     the JSON answers: tokenization and packing, the data job's masking and pair
                 construction, MaskedLM, the record decoder, the encoder's own layers
    server.py    the static page (static/, shipped in the package) and /api/VIEW, on the asyncio
                 HTTP stack bert_tf.serve runs on (serving.http_stack)
    __main__.py  the CLI: flags -> PlaygroundSettings -> a server on 127.0.0.1
"""
