# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create .venv/ when it is missing and install requirements*.txt and the package.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR := build/demo
DEMO_REQUEST := {"instances": ["the film was delightful and the music felt lovely .", "the ending seemed awful to me ."]}
# The jobs are quiet by default (bert_tf/quiet.py); --verbosity=1 brings TensorFlow's notices back.

.PHONY: setup demo test lint format bench clean

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
	mkdir -p $(DEMO_DIR)
	$(PY) -m bert_tf.corpus --output_file=$(DEMO_DIR)/corpus.txt
	$(PY) -m bert_tf.build_vocab --input_file=$(DEMO_DIR)/corpus.txt \
	  --output_file=$(DEMO_DIR)/vocab.txt --vocab_size=8000 --do_lower_case=true
	$(PY) -m bert_tf.tokenization --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true \
	  --input_file=$(DEMO_DIR)/corpus.txt --num_lines=3
	$(PY) -m bert_tf.create_pretraining_data --input_file=$(DEMO_DIR)/corpus.txt \
	  --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true --output_dir=$(DEMO_DIR)/tfrecords \
	  --num_shards=2 --dupe_factor=2 --max_seq_length=128 --max_predictions_per_seq=20 --overwrite
	@# The same job as an Apache Beam pipeline (DirectRunner, 2 processes): the same bytes.
	$(PY) -m bert_tf.create_pretraining_data --input_file=$(DEMO_DIR)/corpus.txt \
	  --vocab_file=$(DEMO_DIR)/vocab.txt --do_lower_case=true --output_dir=$(DEMO_DIR)/tfrecords_beam \
	  --num_shards=2 --dupe_factor=2 --max_seq_length=128 --max_predictions_per_seq=20 --overwrite \
	  --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing
	for f in $(DEMO_DIR)/tfrecords/*.tfrecord; do cmp "$$f" "$(DEMO_DIR)/tfrecords_beam/$$(basename $$f)"; done
	@echo "Beam's shards are byte-identical to the local run's"
	$(PY) -m bert_tf.run_pretraining --input_file='$(DEMO_DIR)/tfrecords/*.tfrecord' \
	  --output_dir=$(DEMO_DIR)/pretrained --model_size=tiny --vocab_file=$(DEMO_DIR)/vocab.txt \
	  --do_lower_case=true --do_train --do_eval --train_batch_size=32 --eval_batch_size=32 \
	  --max_seq_length=128 --max_predictions_per_seq=20 --num_train_steps=300 \
	  --num_warmup_steps=30 --steps_per_loop=50 --save_checkpoints_steps=100 \
	  --max_eval_steps=20 --learning_rate=2e-4
	$(PY) -c "from bert_tf import quiet; quiet.install(); from bert_tf.tasks.classification.data import write_demo_glue_dir; write_demo_glue_dir('$(DEMO_DIR)/glue')"
	$(PY) -m bert_tf.run_classifier --task_name=sst2 --data_dir=$(DEMO_DIR)/glue \
	  --init_checkpoint=$(DEMO_DIR)/pretrained --output_dir=$(DEMO_DIR)/classifier \
	  --do_train --do_eval --do_predict --max_seq_length=24 --train_batch_size=32 \
	  --learning_rate=1e-3 --num_train_epochs=10
	cat $(DEMO_DIR)/classifier/eval_results.txt
	$(PY) -m bert_tf.export --model_dir=$(DEMO_DIR)/classifier --export_dir=$(DEMO_DIR)/export/demo_sst2
	@# Multiple choice (SWAG's CSV layout): fine-tune, evaluate, export (context + endings in).
	$(PY) -c "from bert_tf import quiet; quiet.install(); from bert_tf.tasks.multiple_choice.data import write_demo_swag_dir; write_demo_swag_dir('$(DEMO_DIR)/swag')"
	$(PY) -m bert_tf.run_multiple_choice --task_name=swag --data_dir=$(DEMO_DIR)/swag \
	  --init_checkpoint=$(DEMO_DIR)/pretrained --output_dir=$(DEMO_DIR)/swag_model \
	  --do_train --do_eval --do_predict --max_seq_length=32 --train_batch_size=32 \
	  --learning_rate=1e-3 --num_train_epochs=10
	cat $(DEMO_DIR)/swag_model/eval_results.txt
	$(PY) -m bert_tf.export --model_dir=$(DEMO_DIR)/swag_model --export_dir=$(DEMO_DIR)/export/demo_swag
	@# Serve the export over TF Serving's REST and gRPC APIs on free ports, ask both, stop.
	$(PY) -m bert_tf.serve --model_base_path=$(DEMO_DIR)/export/demo_sst2 --model_name=demo_sst2 \
	  --rest_api_port=0 --port=0 > $(DEMO_DIR)/serve.log 2>&1 & pid=$$!; trap "kill $$pid" EXIT; \
	  for i in $$(seq 300); do \
	    url=$$(grep -o 'serving demo_sst2 version [0-9]* at http://127.0.0.1:[0-9]*' $(DEMO_DIR)/serve.log \
	      | grep -o 'http://.*'); \
	    [ -n "$$url" ] && break; kill -0 $$pid || { cat $(DEMO_DIR)/serve.log; exit 1; }; sleep 1; \
	  done; \
	  [ -n "$$url" ] || { echo "the server did not report serving in 300 s"; cat $(DEMO_DIR)/serve.log; exit 1; }; \
	  grpc=$$(grep -o 'gRPC API at [0-9.:]*' $(DEMO_DIR)/serve.log | head -n 1 | cut -d' ' -f4); \
	  printf '%s\n' '$(DEMO_REQUEST)' > $(DEMO_DIR)/request.json; cat $(DEMO_DIR)/request.json; \
	  echo "curl -X POST $$url/v1/models/demo_sst2:predict -d @$(DEMO_DIR)/request.json"; \
	  curl -sS --fail-with-body -X POST "$$url/v1/models/demo_sst2:predict" -d @$(DEMO_DIR)/request.json; echo; \
	  echo "python -m bert_tf.serving.client --server=$$grpc --model_name=demo_sst2 TEXT... (gRPC)"; \
	  $(PY) -m bert_tf.serving.client --server=$$grpc --model_name=demo_sst2 \
	    "the film was delightful and the music felt lovely ." "the ending seemed awful to me ."

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# ruff: the formatter's check and the linter (pyproject.toml says which rules).
lint: $(STAMP)
	$(VENV)/bin/ruff format --check bert_tf tests benchmarks
	$(VENV)/bin/ruff check bert_tf tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format bert_tf tests benchmarks
	$(VENV)/bin/ruff check --fix bert_tf tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build
