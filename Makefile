# Two entry points: `make run` and `make test`. Both create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPARK_STAMP := $(VENV)/.installed-spark

# Every broker, controller and `tide` process that the suite and `make run` start imports tidelog's
# modules. Where the environment sets PYTHONDONTWRITEBYTECODE, each of them compiled every module
# from source again: 1.4 s of a broker's start against 0.5 s from __pycache__ (gitignored) on the
# bench machine. The bytecode is written once and read by every process after.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install spark lab-tools doc-tools node-client run test warm check lint imports proto bench bench-spark fuzz clean sim sim-mutants drills

# setuptools tells every editable install of a package-dir mapping to be careful with folders named
# like the package (ours are: that is the layout), in a framed notice pip shows even with -q.
QUIET_BUILD := PYTHONWARNINGS="ignore:Editable installation"

$(STAMP): pyproject.toml setup.py commitlog/_speedups.c
	@# Debian ships venv separately (python3-venv); install it when we can rather than fail.
	$(PYTHON) -m venv $(VENV) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -q && apt-get install -y -q python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	@# The C loops (commitlog/_speedups.c) need a compiler and Python's headers: install Debian's when
	@# we can. Without them pip skips the module and the same loops run in Python.
	@command -v cc >/dev/null && $(PYTHON) -c "import os, sysconfig, sys; \
		sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc python3-dev; \
		else echo "note: no C compiler or Python headers: tidelog runs its per-record loops in Python" >&2; fi; }
	$(BIN)/pip install -q --upgrade pip
	$(QUIET_BUILD) $(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The Spark extra (pyspark, pyarrow: ~0.7 GB) and a JDK, for the Spark tests and jobs; `make run` does without.
JAVA_OK = java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])' && javac -version 2>&1 | grep -qE 'javac (1[7-9]|[2-9][0-9])'
$(SPARK_STAMP): $(STAMP)
	@# Spark 4 runs on Java 17 or 21, and the data-port reader (spark/jvm) is compiled with javac:
	@# install Debian's JDK when we can rather than fail.
	@$(JAVA_OK) || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -q && { DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jdk-headless || \
				DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-21-jdk-headless; }; \
		fi; \
		$(JAVA_OK) || { \
			echo "Spark needs Java 17 or 21 as 'java' and 'javac' on PATH (Debian: apt-get install openjdk-17-jdk-headless)" >&2; \
			exit 1; }; }
	$(QUIET_BUILD) $(BIN)/pip install -q -e '.[dev,spark]'
	touch $(SPARK_STAMP)

# The JVM reader of the brokers' data port (`format("tidelog-dataport")`, spark/dataport.py),
# compiled against the jars pyspark bundles; the jar is built here, never checked in.
SPARK_JAR := spark/jvm/tidelog-spark.jar
JAVA_SOURCES := $(wildcard spark/jvm/src/main/java/io/tidelog/spark/*.java)
JAVA_RESOURCES := spark/jvm/src/main/resources/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister
$(SPARK_JAR): $(JAVA_SOURCES) $(JAVA_RESOURCES) $(SPARK_STAMP)
	rm -rf spark/jvm/build && mkdir -p spark/jvm/build/classes
	javac --release 17 -Xlint:all,-path -Werror -d spark/jvm/build/classes \
		-cp "$$($(BIN)/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/jars/*" \
		$(JAVA_SOURCES)
	cp -r spark/jvm/src/main/resources/. spark/jvm/build/classes/
	jar --create --file $@.tmp -C spark/jvm/build/classes .
	mv $@.tmp $@
	rm -rf spark/jvm/build

spark: $(SPARK_STAMP) $(SPARK_JAR)

# The network lab (`tide cluster up --netns`, tests/lab) needs `ip` and `nft`: install Debian's
# when we can. Without root the lab tests skip and say why.
lab-tools:
	@command -v ip >/dev/null && command -v nft >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 nftables; \
		else echo "note: ip/nft missing and not root: the network-lab tests will be skipped" >&2; fi; }

# The README's shell examples use jq (reading cluster.json) and curl (metrics); the suite runs them
# as written (tests/cli/test_readme_blocks.py). Debian's, when missing and we are root.
doc-tools:
	@command -v jq >/dev/null && command -v curl >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q jq curl; \
		else echo "note: jq/curl missing and not root: the README's shell examples cannot run" >&2; fi; }

# The official RocketMQ Node.js client for tests/client/test_rocketmq_node.py, at the version
# tests/client/node/package-lock.json pins (`npm ci`); Node 18 or later, from Debian when it is
# missing and we are root. Without Node those tests skip and say why.
NODE_DIR := tests/client/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
NODE_OK = node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' 2>/dev/null && command -v npm >/dev/null
$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@$(NODE_OK) || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; \
		fi; }
	@if $(NODE_OK); then \
		cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "note: no Node 18+ with npm (Debian: apt-get install nodejs npm): the Node.js client's tests will be skipped" >&2; fi

node-client: $(NODE_STAMP)

run: install
	$(BIN)/tide demo

# The pure cores (rules and state machines with time passed in, no I/O, no clock, no environment)
# are type-checked strictly; every package, shells included, is type-checked without --strict
# (PACKAGES), and linted (ruff: style, complexity, private access, banned imports) and formatted.
# The package-dir mapping hides one folder's modules from mypy in another's (an import of
# tidelog.x is not followed, and what it names is Any): each file is checked on its own terms.
CORES = controller/liveness.py controller/election.py controller/state.py controller/model.py \
	controller/commands.py controller/validation.py controller/phases.py controller/membership.py \
	controller/mastership.py controller/topics.py controller/ledgermeta.py controller/replacement.py \
	controller/snapshot.py controller/placement.py controller/ledgerview.py controller/users.py tidelog/clusterepoch.py tidelog/acl.py tidelog/access.py ha/syncstate.py ha/ackpolicy.py ha/lease.py ha/rpobound.py ha/mastercore.py \
	ha/slavecore.py ha/roles.py commitlog/retentionpolicy.py commitlog/topicretention.py commitlog/batch.py commitlog/keyformat.py tidelog/dataport_frames.py ledger/recovery.py ledger/seglog_plan.py \
	client/assign.py client/commitpace.py client/handover.py client/modes.py client/resetplan.py broker/sharedstate.py broker/offsetscheckpoint.py broker/rocketmqrules.py broker/delayrules.py broker/txstate.py lab/plan.py lab/rules.py \
	sim/__init__.py sim/broker.py sim/checker.py sim/controllers.py sim/disk.py sim/faults.py sim/ledger.py sim/net.py sim/world.py

PACKAGES = tidelog commitlog ha controller ledger broker client spark lab sim localcluster drill cli

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict --follow-imports=silent --ignore-missing-imports $(CORES)
	$(BIN)/mypy --follow-imports=silent --ignore-missing-imports $(PACKAGES)

# The import graph between the subpackages (exits 1 naming any cycle); `--modules` lists every module.
imports: install
	$(BIN)/python -m tidelog.importgraph

# The suite runs on TEST_WORKERS pytest-xdist workers, a module to a worker (its module-scoped
# cluster is started once), the longest modules first (tests/conftest.py; xdist's own reordering by
# test count is off so that this order holds); each worker draws ports from a range of its own.
# Four workers on two cores: with three, the cores were idle a third of the run once the tests
# stopped polling through `tide` processes and waiting out fixed periods (they wait for a failover,
# a timeout, an fsync), and a fourth worker fills those waits: 9 min 18 s against 10 min 31 s
# with three, on the same code. Three had been chosen while the suite kept the cores busy
# throughout, when four starved replicas of acks (FLUSH_SLAVE_TIMEOUT, a slave leaving its
# SyncStateSet). Every test that failed on more workers had a cause of its own, mended: an
# orphaned transaction running out of checks (949610d), a RocketMQ consumer polling queues at
# random (28ea4a4), a test patching time.sleep for every thread of its process (2e18955), brokers
# that heartbeat once outlived by a test's own CLI calls (2b55b8c), a closing commit sent before a
# new master took its role (tests/client/test_group_offsets_admin.py).
# The commit-log tests run a second time on the Python twins of the C loops (commitlog/speedups.py),
# in a pytest process of their own that one worker starts beside the others
# (tests/commitlog/test_python_twins.py).
# Bytecode first (`warm`, beside the lint on the other core): on a fresh clone every worker
# compiled every module itself and rewrote every test module's asserts (8 s of CPU each, 2.5 s
# from pytest's cache), and the first clusters' processes compiled the package again, all at once.
TEST_WORKERS ?= 4
test: install spark lab-tools doc-tools node-client
	$(MAKE) --no-print-directory -j2 lint warm
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not drills"

# The repository's modules compiled and the test modules' rewritten asserts cached (a collection
# of the suite, which also reports a module that does not import); the output only on failure.
warm: install
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES) bench tests > /dev/null
	@$(BIN)/pytest -q --collect-only -m "not drills" > $(VENV)/collect.log 2>&1 || { cat $(VENV)/collect.log; exit 1; }

# The network lab's other drill scenarios (tests/lab/test_lab.py: `make test` runs one, and the README's lab block one and a random schedule; the rules
# they check are the simulator's, under faults): about two minutes, one worker, root for the lab.
drills: install lab-tools
	$(BIN)/pytest -q -m drills tests/lab

# The fast loop: lint and every test that starts no cluster (the `slow` ones run in `make test`).
check: install lint
	$(BIN)/pytest -q -m "not slow" -x

proto: install
	$(BIN)/python -m grpc_tools.protoc -I tidelog/proto --python_out=tidelog/proto --pyi_out=tidelog/proto \
		--grpc_python_out=tidelog/proto tidelog/proto/*.proto
	sed -i -E 's/^import ([a-z_]+_pb2) as /from tidelog.proto import \1 as /' tidelog/proto/*_pb2*.py
	@# RocketMQ's gRPC API (apache/rocketmq-apis v2, vendored unchanged under its own paths) is
	@# generated flat into tidelog/proto/rocketmq, its imports naming that package.
	$(BIN)/python -m grpc_tools.protoc -I tidelog/proto/rocketmq --python_out=tidelog/proto/rocketmq \
		--pyi_out=tidelog/proto/rocketmq --grpc_python_out=tidelog/proto/rocketmq \
		tidelog/proto/rocketmq/apache/rocketmq/v2/*.proto
	mv tidelog/proto/rocketmq/apache/rocketmq/v2/*_pb2* tidelog/proto/rocketmq/
	sed -i -E 's/^from apache\.rocketmq\.v2 import ([a-z_]+_pb2) as /from tidelog.proto.rocketmq import \1 as /' \
		tidelog/proto/rocketmq/*_pb2*.py tidelog/proto/rocketmq/*_pb2.pyi

# The fuzzers of tests/fuzz with FUZZ_EXAMPLES inputs each (the pytest run tries a few hundred):
# a line per fuzzer with its inputs, time and failures; a failing input is printed in full.
FUZZ_EXAMPLES ?= 1000000
fuzz: install
	$(BIN)/python -m tests.fuzz.run --examples $(FUZZ_EXAMPLES)

# The deterministic simulator (sim/README.md): SIM_SEEDS seeds from SIM_START, the last line one
# JSON summary; a failing seed prints the command that replays it. sim-mutants applies each
# deliberate bug in-process and prints how many seeds it took to catch.
SIM_SEEDS ?= 10000
SIM_START ?= 0
sim: install
	$(BIN)/python -m tidelog.sim --seeds $(SIM_SEEDS) --start $(SIM_START)

sim-mutants: install
	$(BIN)/python -m tidelog.sim --mutants --seeds $(SIM_SEEDS) --start $(SIM_START)

bench: install
	$(BIN)/python -m bench.commitlog

bench-spark: spark
	$(BIN)/python -m bench.spark_read

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(SPARK_JAR) spark/jvm/build
