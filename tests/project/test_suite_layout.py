"""The suite is laid out like the code (docs/development.md draws it): a folder of tests/ per
part, helpers in a package of their own, fixtures and hooks alone in conftest.py. Checked:

- no test file sits at tests/'s top: each is in the folder of its part;
- every folder of tests/ is drawn in docs/development.md, and each folder of test files (and
  helpers/) is a package whose __init__.py says what it holds: packages, so that two folders may
  hold files of the same name under pytest's default import mode;
- no module of the suite imports conftest, nor a helper by its bare name (``import hostfacts``
  from before helpers/ was a package): a helper is imported from helpers, by name;
- conftest.py defines only fixtures, pytest's hooks and private functions they use, and assigns
  only pytest_plugins.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
HELPERS = TESTS / "helpers"
# Folders of things other than pytest's test files: the C core's programs, the fuzz targets
# and the kernel matrix's scripts (each with its own Makefile or entry point).
NOT_PACKAGES = {"c", "fuzz", "matrix"}


def folders() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def suite_modules() -> list[Path]:
    return sorted(p for d in folders() if d.name not in NOT_PACKAGES for p in d.rglob("*.py")) + [
        TESTS / "conftest.py"]


def test_no_test_file_at_the_top() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"tests/{loose}: put each in the folder of the part it tests"


def test_every_folder_is_drawn_and_says_what_it_holds() -> None:
    drawing = (ROOT / "docs" / "development.md").read_text()
    problems = []
    for folder in folders():
        if f"\ntests/{folder.name}/ " not in drawing:
            problems.append(f"tests/{folder.name}/ is not drawn in docs/development.md")
        if folder.name in NOT_PACKAGES:
            continue
        init = folder / "__init__.py"
        if not init.is_file() or not ast.get_docstring(ast.parse(init.read_text())):
            problems.append(f"tests/{folder.name}/__init__.py: missing, or without a docstring "
                            "that says what the folder holds")
    assert not problems, "\n".join(problems)


def test_helpers_are_imported_by_name_from_helpers() -> None:
    bare = {p.stem for p in HELPERS.glob("*.py")} - {"__init__"}
    problems = []
    for path in suite_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "conftest":
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} imports conftest: "
                                    "a fixture needs no import, a helper comes from helpers/")
                elif top in bare:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}: "
                                    f"import it from helpers.{top}")
    assert not problems, "\n".join(problems)


def test_conftest_holds_fixtures_and_hooks_only() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    problems = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fixture = any("fixture" in ast.unparse(d) for d in node.decorator_list)
            if not (fixture or node.name.startswith(("pytest_", "_"))):
                problems.append(f"{node.name}(): neither a fixture nor a hook (to helpers/)")
        elif isinstance(node, ast.ClassDef):
            problems.append(f"class {node.name} (to helpers/)")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [ast.unparse(t) for t in targets]
            if names != ["pytest_plugins"]:
                problems.append(f"{', '.join(names)} = ... (a constant: to helpers/)")
    assert not problems, "tests/conftest.py:\n" + "\n".join(problems)
