"""The layout shows the design: no circles between files, and no include a file does not use.

C core (csrc/, recursively). A module is a header and its source together: csrc/kvm/vm.h and
csrc/kvm/vm.c are the module kvm/vm (guest.S and guest.h are kvm/guest); a header without a
source (ukvm.h, experiment/state.h) is a module of its own. Module A depends on module B when
any file of A has ``#include "B.h"``. Checked:

- no cycle between modules (a header and its .c count as one, so a .c that includes a header
  whose functions call back into it is a cycle);
- the layers base/ < kvm/ < remote/ < uffd/ < experiment/ < python/ include only downwards;
- only python/ (the binding) includes Python.h, and it includes of the core only ukvm.h;
- every function or variable a header declares is defined in its own module (else the include
  graph would hide the real dependency: a header that declares another file's functions lets
  two files call each other while including only one header). ukvm.h is exempt: it is the
  public interface, implemented by the modules below it;
- no .c includes a header it does not use: at least one name the header declares (function,
  macro, struct, enum or enumerator, typedef, variable) appears in the .c. A cheap heuristic,
  but it catches the include left behind when the code that needed it moved;
- internal.h, the one header every file used to include, is gone.

Python package (uffdkvm/, recursively; docs/development.md draws it). Its parts: the core at the
top (config, run, result and the modules beside them: each a part of its own), and one part per
subpackage (schema/, host/, io/, pages/, analysis/, migration/, testing/, kernels/, cli/). Every
import in a module counts, also those inside functions and under ``if TYPE_CHECKING``: an import
deferred to break an import-time loop still ties the two files to each other. Checked:

- no import cycle between modules, nor between parts (a subpackage counts as one);
- the core and the parts below it (schema/, host/, io/, pages/) import none of the features
  above (analysis/, migration/, testing/, kernels/, cli/);
- schema/ imports nothing of uffdkvm (tools/gen_schema.py loads it by its path, before a build);
- nothing imports the CLI but ``__main__`` (it is the top), and nothing in the package imports
  testing/_faults.py (the fault injection only a test build ships);
- a top-level module without a leading underscore is public: the package re-exports a name of
  it, or it is a module users import (PUBLIC_MODULES).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
PKG = ROOT / "uffdkvm"

PUBLIC_HEADERS = {"ukvm.h"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


# ---- C ----

def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def c_files() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".c", ".h", ".S"))


def module_of(path: Path) -> str:
    return path.relative_to(CSRC).with_suffix("").as_posix()


def resolve_include(path: Path, name: str) -> Path | None:
    """As the compiler does with -Icsrc: next to the file first, then from csrc/."""
    for base in (path.parent, CSRC):
        if (base / name).is_file():
            return (base / name).resolve()
    return None


def c_includes() -> dict[Path, list[Path]]:
    includes: dict[Path, list[Path]] = {}
    for path in c_files():
        found = []
        for name in INCLUDE.findall(strip_comments(path.read_text())):
            target = resolve_include(path, name)
            assert target is not None, f"{path.relative_to(ROOT)}: #include \"{name}\" not found"
            found.append(target)
        includes[path.resolve()] = found
    return includes


def module_graph(includes: dict[Path, list[Path]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path, targets in includes.items():
        deps = graph.setdefault(module_of(path), set())
        for target in targets:
            if module_of(target) != module_of(path):
                deps.add(module_of(target))
                graph.setdefault(module_of(target), set())
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe_cycle(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "{" + ", ".join(component) + "}: " + "; ".join(edges)


PROTOTYPE = re.compile(r"^(?!static\b|typedef\b|extern\b|struct\b[^(]*\{|enum\b|#)"
                       r"[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\(", re.M)
STATIC_INLINE = re.compile(r"^static\s+inline\b[^(]*?\b([A-Za-z_]\w*)\s*\(", re.M)
EXTERN = re.compile(r"^extern\b[^;(]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*;", re.M)
MACRO = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)", re.M)
TAG = re.compile(r"\b(?:struct|union|enum)\s+([A-Za-z_]\w*)\s*[{;]")
ENUM_BODY = re.compile(r"\benum\b[^{;]*\{([^}]*)\}", re.S)
TYPEDEF = re.compile(r"\btypedef\b[^;]*?\(?\s*\*?\s*([A-Za-z_]\w*)\s*\)?\s*(?:\([^;]*\))?\s*;")
IDENT = re.compile(r"[A-Za-z_]\w*")


def prototypes(header_text: str) -> set[str]:
    """Functions and variables the header declares but does not define."""
    return set(PROTOTYPE.findall(header_text)) | set(EXTERN.findall(header_text))


def declared_names(header: Path) -> set[str]:
    text = strip_comments(header.read_text())
    names = prototypes(text) | set(STATIC_INLINE.findall(text))
    names |= set(MACRO.findall(text)) | set(TAG.findall(text)) | set(TYPEDEF.findall(text))
    for body in ENUM_BODY.findall(text):
        names |= {m.group(0) for m in re.finditer(r"^\s*([A-Za-z_]\w*)", body, re.M)}
        names |= set(re.findall(r",\s*([A-Za-z_]\w*)", body))
    # The include guard names nothing a user needs.
    return {n for n in names if not re.fullmatch(r"UKVM_\w*_H", n)}


def test_internal_header_is_gone() -> None:
    internal = CSRC / "internal.h"
    if internal.exists():
        text = strip_comments(internal.read_text())
        assert not INCLUDE.search(text) and not re.search(r"[;{]", text), (
            "csrc/internal.h may only be an index comment listing the per-topic headers")


def test_no_include_cycles_in_csrc() -> None:
    graph = module_graph(c_includes())
    assert graph, "no C sources found"
    found = cycles(graph)
    assert not found, "modules of csrc/ that include each other in a circle:\n" + "\n".join(
        describe_cycle(c, graph) for c in found)


LAYERS = ["base", "kvm", "remote", "uffd", "experiment", "python"]  # bottom to top


def test_layers_include_only_downwards() -> None:
    """base/ < kvm/ < remote/ < uffd/ < experiment/ < python/; the headers at csrc/'s top are for
    every layer."""
    problems = []
    for path, targets in c_includes().items():
        parts = path.relative_to(CSRC).parts
        if len(parts) == 1:
            continue  # ukvm.h, testhooks.h, uapi_compat.h, config_schema.h, result_schema.h
        for target in targets:
            to = target.relative_to(CSRC).parts
            if len(to) > 1 and LAYERS.index(to[0]) > LAYERS.index(parts[0]):
                problems.append(f"{path.relative_to(CSRC)} (layer {parts[0]}) includes "
                                f"{target.relative_to(CSRC)} from the layer above, {to[0]}")
    assert not problems, "\n".join(problems)


def test_only_the_binding_knows_python() -> None:
    """The core is a plain C library: Python.h only in python/, and the binding
    reaches the core only through its public interface, ukvm.h."""
    problems = []
    for path, targets in c_includes().items():
        parts = path.relative_to(CSRC).parts
        text = path.read_text()
        if parts[0] != "python":
            if re.search(r'#\s*include\s*<Python.h>', text):
                problems.append(f"{path.relative_to(CSRC)} includes Python.h outside python/")
            continue
        for target in targets:
            to = target.relative_to(CSRC).parts
            if to[0] not in ("python", "ukvm.h", "config_schema.h", "testhooks.h"):
                problems.append(f"{path.relative_to(CSRC)} includes {target.relative_to(CSRC)}: "
                                f"the binding uses the core through ukvm.h alone")
    assert not problems, "\n".join(problems)


def test_headers_declare_only_their_own_modules_functions() -> None:
    problems = []
    for header in CSRC.rglob("*.h"):
        if header.name in PUBLIC_HEADERS:
            continue
        sources = [header.with_suffix(s) for s in (".c", ".S") if header.with_suffix(s).exists()]
        text = "\n".join(strip_comments(s.read_text()) for s in sources)
        for name in sorted(prototypes(strip_comments(header.read_text()))):
            defined = re.search(rf"^[^\s#;][^;]*\b{name}\b\s*(\(|\[|=|:)[^;]*$", text, re.M) or (
                re.search(rf"^\s*{name}:", text, re.M))
            if not defined:
                problems.append(f"{header.relative_to(CSRC)} declares {name}, which "
                                f"{' or '.join(s.name for s in sources) or 'no source of its own'}"
                                " does not define")
    assert not problems, "\n".join(problems)


def test_no_unused_includes_in_csrc() -> None:
    problems = []
    for path, targets in c_includes().items():
        if path.suffix != ".c":
            continue
        used = set(IDENT.findall(strip_comments(path.read_text())))
        for target in targets:
            if not used & declared_names(target):
                problems.append(f"{path.relative_to(CSRC)} includes {target.relative_to(CSRC)} "
                                "but uses nothing it declares")
    assert not problems, "\n".join(problems)


# ---- Python ----

LOWER = {"schema", "host", "io", "pages"}                        # below or beside the core
FEATURES = {"analysis", "migration", "testing", "kernels", "cli"}  # on top of it
PUBLIC_MODULES = {"config", "errors", "result", "run"}  # imported as modules in docs and by users


def py_modules() -> dict[str, Path]:
    """Every module by its dotted name within the package ("cli.run"; a package's
    __init__ by the package's name, the top's as "__init__")."""
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def part_of(module: str) -> str:
    return module.split(".")[0]


def imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that ``module`` imports (by name within it)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if module == "__init__":
        package = ""

    def target(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            if list(PKG.glob(name.replace(".", "/") + ".*")):
                return None  # an extension module (_core): no Python to import back
            name = name.rpartition(".")[0]
        return "__init__"  # a name the package itself defines

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - node.level + 1]
            elif node.module and (node.module == PKG.name or
                                  node.module.startswith(PKG.name + ".")):
                base = []
            else:
                continue
            name = node.module or ""
            if node.level == 0:
                name = name[len(PKG.name):].lstrip(".")
            where = ".".join(base + ([name] if name else []))
            for alias in node.names:
                whole = f"{where}.{alias.name}" if where else alias.name
                found.add(target(whole))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PKG.name or alias.name.startswith(PKG.name + "."):
                    found.add(target(alias.name[len(PKG.name):].lstrip(".")))
    return {t for t in found if t and t != module}


def py_graph() -> dict[str, set[str]]:
    modules = py_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def parts_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, deps in graph.items():
        parts.setdefault(part_of(module), set()).update(
            part_of(d) for d in deps if part_of(d) != part_of(module))
    return parts


def test_no_import_cycles_in_package() -> None:
    graph = py_graph()
    assert "config" in graph and "cli.run" in graph, "no Python modules found"
    found = cycles(graph)
    assert not found, "modules of uffdkvm/ that import each other in a circle:\n" + "\n".join(
        describe_cycle(c, graph) for c in found)


def test_no_import_cycles_between_parts() -> None:
    graph = parts_graph(py_graph())
    found = cycles(graph)
    assert not found, "parts of uffdkvm/ (top-level modules, subpackages) that import each " \
        "other in a circle:\n" + "\n".join(describe_cycle(c, graph) for c in found)


def test_parts_are_where_the_layout_says() -> None:
    """A new subpackage is placed among the layers here and drawn in docs/development.md."""
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages == LOWER | FEATURES, (
        f"uffdkvm's subpackages {sorted(packages)} are not LOWER | FEATURES: place a new one "
        "in a layer here and in docs/development.md's drawing")


def test_the_core_leans_on_no_feature() -> None:
    problems = []
    for module, deps in py_graph().items():
        if part_of(module) in FEATURES or module in ("__init__", "__main__"):
            continue
        for dep in sorted(deps):
            if part_of(dep) in FEATURES:
                problems.append(f"{module} imports {dep}: {part_of(dep)}/ is a feature on top "
                                "of the core, which must not lean on it")
    assert not problems, "\n".join(problems)


def test_schema_imports_nothing_of_the_package() -> None:
    graph = py_graph()
    leaning = {m: sorted(d) for m, d in graph.items() if part_of(m) == "schema" and d}
    assert not leaning, f"schema/ must load by its path alone (tools/gen_schema.py): {leaning}"


def test_only_main_imports_the_cli_and_nothing_the_fault_injection() -> None:
    problems = []
    for module, deps in py_graph().items():
        if part_of(module) != "cli" and module != "__main__":
            problems += [f"{module} imports {d}" for d in deps if part_of(d) == "cli"]
        problems += [f"{module} imports {d} (only test builds ship it)"
                     for d in deps if d == "testing._faults"]
    assert not problems, "\n".join(problems)


def test_top_level_modules_without_underscore_are_public() -> None:
    init = (PKG / "__init__.py").read_text()
    reexported = {n.module for n in ast.walk(ast.parse(init))
                  if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
    internal = [p.stem for p in PKG.glob("*.py") if not p.stem.startswith("_")
                and p.stem not in reexported | PUBLIC_MODULES]
    assert not internal, (f"top-level modules {internal} are neither re-exported by uffdkvm nor "
                          "public: underscore them or move them into the subpackage they serve")
