import pytest

from tests.conformance.oracle import Oracle


@pytest.fixture(scope="session")
def oracle():
    o = Oracle()
    yield o
    o.close()
