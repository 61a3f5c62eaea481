# Two entry points: `make run` and `make test`. Both create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint proto bench clean

$(STAMP): pyproject.toml
	@# Debian ships venv separately (python3-venv); install it when we can rather than fail.
	$(PYTHON) -m venv $(VENV) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -q && apt-get install -y -q python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/tide demo

lint: install
	$(BIN)/ruff check .

test: install lint
	$(BIN)/pytest -q

proto: install
	$(BIN)/python -m grpc_tools.protoc -I tidelog/proto --python_out=tidelog/proto --pyi_out=tidelog/proto \
		--grpc_python_out=tidelog/proto tidelog/proto/*.proto
	sed -i -E 's/^import ([a-z_]+_pb2) as /from tidelog.proto import \1 as /' tidelog/proto/*_pb2*.py

bench: install
	$(BIN)/python -m bench.commitlog

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
