"""Without its optional extras kforge still imports, and each feature behind one says which extra to install.

Checked in a fresh interpreter where the extras' packages cannot be imported (here they may be installed)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import extras

# what a user reaches for -> the extra its message must name
FEATURES = {
    "kforge.views.RunProgress": "notebook",
    "kforge.views.charts": "notebook",
    "the dashboard a display hook shows": "notebook",
    "%load_ext kforge": "notebook",
    "make_proposer('anthropic')": "llm",
    "make_proposer('openai')": "llm",
    "kforge.models.build('gemma4_e2b')": "models",
    "kforge.models.build('sd35_vae_decoder')": "models",
    "cluster='ray'": "ray",
}

_PROBE = textwrap.dedent("""
    import importlib.abc, json, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    BLOCKED = set(json.loads(sys.argv[1]))
    sys.meta_path.insert(0, NotInstalled())

    import kforge, kforge.views, kforge.proposers, kforge.models, kforge.cluster   # none needs an extra to import

    def _views(name):
        return lambda: getattr(kforge.views, name)

    def _dashboard():
        from kforge.views._dashboard import dashboard   # what Session's display hook calls
        dashboard(None)

    def _magics():
        kforge.load_ipython_extension(None)

    def _proposer(name):
        from kforge.proposers import make_proposer
        return lambda: make_proposer(name, api_key="k")

    def _model(name):
        return lambda: kforge.models.build(name)

    def _ray():
        from kforge.cluster import RayCluster
        RayCluster.from_spec("ray")

    FEATURES = {
        "kforge.views.RunProgress": _views("RunProgress"),
        "kforge.views.charts": _views("charts"),
        "the dashboard a display hook shows": _dashboard,
        "%load_ext kforge": _magics,
        "make_proposer('anthropic')": _proposer("anthropic"),
        "make_proposer('openai')": _proposer("openai"),
        "kforge.models.build('gemma4_e2b')": _model("gemma4_e2b"),
        "kforge.models.build('sd35_vae_decoder')": _model("sd35_vae_decoder"),
        "cluster='ray'": _ray,
    }
    said = {}
    for feature, use in FEATURES.items():
        try:
            use()
            said[feature] = "no error"
        except Exception as exc:
            said[feature] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(said))
""")


def test_each_feature_behind_an_extra_names_it_when_it_is_missing():
    blocked = sorted({m for extra in set(FEATURES.values()) for m in extras.modules(extra)})
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(blocked)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said.keys() == FEATURES.keys()
    wrong = {f: m for f, m in said.items() if not m.startswith(("ImportError", "MissingDependency"))
             or f"kforge[{FEATURES[f]}]" not in m}
    assert not wrong, wrong
