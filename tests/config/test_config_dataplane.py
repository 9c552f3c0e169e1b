"""The data-plane settings: which store, TransferQueue's knobs, and that both are operational."""

from __future__ import annotations

import pytest

from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import DataPlaneKind
from rollvault.controller.loop.data_plane import build_data_plane, data_plane_services
from rollvault.controller.snapshots.resume import run_fingerprint
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import EmbeddedDataPlane


def test_dataplane_settings_load_from_overrides() -> None:
    config = load_run_config(
        None,
        [
            "dataplane.kind=transfer_queue",
            "dataplane.transfer_queue.num_storage_units=2",
            "dataplane.transfer_queue.init_timeout_s=30",
            "dataplane.transfer_queue.ray_num_cpus=8",
        ],
    )
    assert config.dataplane.kind is DataPlaneKind.TRANSFER_QUEUE
    settings = config.dataplane.transfer_queue
    assert (settings.num_storage_units, settings.init_timeout_s, settings.ray_num_cpus) == (
        2,
        30,
        8,
    )


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("dataplane.kind=redis", "kind"),
        ("dataplane.transfer_queue.num_storage_units=0", "num_storage_units"),
        ("dataplane.transfer_queue.init_timeout_s=0", "init_timeout_s"),
        ("dataplane.transfer_queue.ray_num_cpus=0", "ray_num_cpus"),
    ],
)
def test_out_of_range_dataplane_settings_name_the_field(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_run_config(None, [override])


def test_the_store_is_operational_a_run_may_resume_on_the_other() -> None:
    embedded = load_run_config(None, [])
    on_tq = load_run_config(
        None, ["dataplane.kind=transfer_queue", "dataplane.transfer_queue.num_storage_units=3"]
    )
    assert run_fingerprint(embedded) == run_fingerprint(on_tq)


def test_the_embedded_store_needs_no_services() -> None:
    config = load_run_config(None, [])
    with data_plane_services(config.dataplane):
        plane = build_data_plane(config.dataplane, DataPlaneMutationCut())
    assert isinstance(plane, EmbeddedDataPlane)
