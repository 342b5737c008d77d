# cdcflow — every target installs what it needs into .venv (Python 3.11+, Java 17).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PYSPARK_PYTHON        := $(CURDIR)/$(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(BIN)/python

.DEFAULT_GOAL := help
.PHONY: help install demo test test-fast bench soak lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml testkit/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "cdcflow needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@command -v java >/dev/null || { echo "cdcflow needs Java 17 on PATH for Spark (apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,demo,verify]' -e ./testkit
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install cdcflow, its test kit (testkit/) and test tools

demo: $(STAMP) ## run the main job on the embedded default (broker, local Spark, Delta in ./demo-warehouse)
	$(BIN)/cdcflow-demo --warehouse demo-warehouse

test: $(STAMP) ## run the whole test suite (unit, Spark, Kafka on tansu and Apache Kafka, end to end)
	@command -v mvn >/dev/null || { echo "make test needs Maven for the Java parts' jars (apt-get install maven)"; exit 1; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "installing PostgreSQL's server (Debian package postgresql) for the capture tests"; apt-get install -y -q postgresql >/dev/null; } || { echo "make test needs PostgreSQL's server: apt-get install postgresql"; exit 1; }
	@command -v mariadb-install-db >/dev/null || { echo "installing MariaDB's server (Debian package mariadb-server) for the capture tests"; apt-get install -y -q mariadb-server >/dev/null; } || { echo "make test needs MariaDB's server: apt-get install mariadb-server"; exit 1; }
	@command -v chromium >/dev/null || { echo "installing Chromium and ChromeDriver (Debian packages chromium, chromium-driver) for the report's browser test"; apt-get install -y -q chromium chromium-driver >/dev/null; } || { echo "make test needs Chromium: apt-get install chromium chromium-driver"; exit 1; }
	$(BIN)/python -m cdcflow_testkit.services.apache_kafka
	$(BIN)/python -m cdcflow_testkit.services.kafka_connect postgres mariadb
	$(BIN)/python -m cdcflow_testkit.services.apicurio
	$(BIN)/python -m cdcflow_testkit.services.maxwell
	$(BIN)/python -m cdcflow_testkit.services.object_stores
	$(BIN)/python -m cdcflow_testkit.services.spark_cluster >/dev/null
	@# Delta Lake's Spark jars (sink: delta-spark) into Maven's cache, where Spark's Ivy finds them
	mvn -q -B dependency:get -Dartifact=io.delta:delta-spark_4.2_2.13:4.4.0
	@# Hadoop's S3A connector and the AWS SDK bundle (686 MB): Spark's checkpoint on S3
	mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.6.1:get -Dartifact=org.apache.hadoop:hadoop-aws:3.5.0
	$(BIN)/python tests/run_suite.py

test-fast: $(STAMP) ## only the tests that need neither Spark nor Kafka nor Java services
	@command -v chromium >/dev/null || { echo "installing Chromium and ChromeDriver (Debian packages chromium, chromium-driver) for the report's browser test"; apt-get install -y -q chromium chromium-driver >/dev/null; } || { echo "make test needs Chromium: apt-get install chromium chromium-driver"; exit 1; }
	$(BIN)/python -m pytest -n 2 -m "not spark and not kafka and not services"

bench: $(STAMP) ## benchmark suite: decode per core for every format, e2e Debezium vs plain PySpark, 20-table Canal, freshness at 20k/s, peak RSS; table + bench/results/latest.json (BENCH_ARGS="--scale 0.1" for a quick look)
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

soak: $(STAMP) ## fault soak: 1M Debezium events with duplicates, replays, bad records; the pipeline SIGKILLed and restarted 5 times; all checked
	$(BIN)/python bench/soak.py

lint: $(STAMP) ## ruff lint and format check; mypy over the product (strict below the run)
	$(BIN)/ruff check src testkit/src tests bench
	$(BIN)/ruff format --check src testkit/src tests bench
	$(BIN)/mypy

clean: ## remove the virtual environment and generated folders
	rm -rf $(VENV) demo-warehouse .pytest_cache build testkit/build
