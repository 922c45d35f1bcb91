import pytest

from gpuwatchd.gpu.bus_id import sysfs_bus_id


@pytest.mark.parametrize(
    ("bus_id", "bdf"),
    [("00000000:0C:00.0", "0000:0c:00.0"), ("0000:0c:00.0", "0000:0c:00.0"), ("0000:0C:00", "0000:0c:00.0"),
     ("00000001:81:00.0", "0001:81:00.0")],
)
def test_sysfs_bus_id(bus_id: str, bdf: str) -> None:
    assert sysfs_bus_id(bus_id) == bdf
