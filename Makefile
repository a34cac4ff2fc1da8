# Two entry points for a fresh machine with Python 3.11+ and make: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench bench-small bench-accuracy clean

$(BIN)/forensics: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(BIN)/forensics

# Each demo starts from a fresh case database: one left by an earlier copy of the sample would
# hold that copy's rows beside these (conflicting duplicates, as for any edited log).
demo: $(BIN)/forensics
	rm -f sample_data/case.duckdb sample_data/real-formats/case.duckdb
	$(BIN)/forensics run sample_data/case.toml --out sample_data/report
	@echo "The same kind of case from SGLang engine logs and OTLP spans:"
	$(BIN)/forensics run sample_data/real-formats --out sample_data/real-formats/report

test: $(BIN)/forensics
	$(BIN)/python -m pytest -q

lint: $(BIN)/forensics
	$(BIN)/ruff check forensics tests benchmarks
	$(BIN)/ruff format --check forensics tests benchmarks
	$(BIN)/mypy

# Scale: forensics stage by stage against the load-once floor and the pandas peer, 1M to 16M
# requests (SIZES=1M,2M picks sizes); cases are cached in benchmarks/.cache/, results written
# to benchmarks/results/latest.json. Hours on a 2-core machine at full size.
SIZES ?= 1M,2M,4M,8M,16M
bench: $(BIN)/forensics
	$(BIN)/pip install --quiet -e '.[bench,spark]' || $(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/run.py --sizes $(SIZES)

# The same harness at 200K requests (a few minutes): what tests/test_bench.py runs.
bench-small: $(BIN)/forensics
	$(BIN)/pip install --quiet -e '.[bench,spark]' || $(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/run.py --small --out benchmarks/results/small.json

bench-accuracy: $(BIN)/forensics
	$(BIN)/python benchmarks/bench_detect.py --requests 1000000
	$(BIN)/python benchmarks/bench_accuracy.py --seeds 1-5 --requests 40000
	$(BIN)/python benchmarks/bench_exploitation.py --seeds 1-20 --requests 40000

clean:
	rm -rf $(VENV) sample_data/report sample_data/case.duckdb
	rm -rf sample_data/real-formats/report sample_data/real-formats/case.duckdb
