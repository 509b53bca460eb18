"""Names moved by the reorganisation still import from their old place, with a DeprecationWarning."""

import pytest

from arl.config import KeepBranches


@pytest.mark.parametrize("module", ["arl.intercept.tracker", "arl.rollout.proxy"])
def test_keep_is_keep_branches_and_deprecated(module):
    mod = __import__(module, fromlist=["Keep"])
    with pytest.warns(DeprecationWarning, match="KeepBranches"):
        assert mod.Keep is KeepBranches
    with pytest.raises(AttributeError):
        mod.NoSuchName  # noqa: B018
