"""The PostgreSQL 15 both PostgreSQL verify modules compare with: a server of the test
kit's own per module, filled with the final rows of Debezium's golden PostgreSQL capture."""

from __future__ import annotations

import pytest
from tests.verify.helpers import PG_CAPTURES, fill_postgres, golden_state

from cdcflow_testkit.services.postgres import LocalPostgres


@pytest.fixture(scope="module")
def pg():
    with LocalPostgres() as server:
        _, state = golden_state(PG_CAPTURES[0])
        fill_postgres(server, state)
        yield server
