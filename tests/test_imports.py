"""The package's imports form a house: no circles, no import that climbs back up, few floors.

Its shape: the `python -m bert_tf.<job>` entry points directly in bert_tf/, and the library below
them in packages by concern (runtime, tokenization, model, checkpoints, training, ...); no library
module imports an entry point.

Every `import` and `from ... import` in bert_tf is read with `ast` (those inside functions too, so a
lazy import cannot hide a circle). A module imports another when it names it, or names a
package and imports one of its modules.
"""

import ast
import functools
import importlib
import pathlib

import pytest

from bert_tf.runtime import job_process
from bert_tf.tasks import registry

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "bert_tf"
MAX_FLOORS = 9
# What only export and the server load: training never imports them.
SERVING_STACK = ("bert_tf.tasks.export_graph", "bert_tf.saved_model", "bert_tf.serving")
# The modules directly in bert_tf/ (entry points and __init__) at most.
MAX_TOP_LEVEL_MODULES = 20
TRAINING_JOBS = job_process.TRAINING_JOBS + ("bert_tf.extract_features",)


def module_files():
    """{module name: path} of every module of bert_tf."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(module, path, modules):
    """The bert_tf modules that `module` imports."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - (not is_package)]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {name for name in found if name in modules and name != module}


@functools.lru_cache(maxsize=None)
def import_graph():
    """{module: the bert_tf modules it imports}."""
    modules = module_files()
    return {name: frozenset(imported_names(name, path, modules)) for name, path in modules.items()}


def find_cycle(graph):
    """One import circle of `graph` as a list of nodes, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                return trail[trail.index(child) :] + [child]
            if child not in state:
                cycle = visit(child, trail + [child])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [node])
            if cycle:
                return cycle
    return None


def floor_of(module, graph, cache):
    """1 + the highest floor of what `module` imports (a module importing nothing is floor 1)."""
    if module not in cache:
        cache[module] = 1 + max((floor_of(m, graph, cache) for m in graph[module]), default=0)
    return cache[module]


def reachable(module, graph):
    """Every module `module` imports, directly or not."""
    seen, todo = set(), [module]
    while todo:
        for child in graph[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def entry_points(modules):
    """The modules directly in bert_tf/ other than its __init__: the `python -m bert_tf.<job>` CLIs."""
    return {m for m, path in modules.items() if path.parent == PACKAGE and path.stem != "__init__"}


def area(module):
    """bert_tf.<first name>: a subpackage, or a top-level module."""
    return ".".join(module.split(".")[:2])


def test_the_graph_sees_the_imports_it_should():
    graph = import_graph()
    assert "bert_tf.model.model_dir" in graph["bert_tf.training.training_loop"]
    assert "bert_tf.tasks.models" in graph["bert_tf.training.finetuning"]
    assert "bert_tf.tasks.export_graph" in graph["bert_tf.tasks.squad.serving"]


def test_the_top_level_holds_the_entry_points_only():
    modules = module_files()
    top = entry_points(modules)
    assert len(top) + 1 <= MAX_TOP_LEVEL_MODULES, sorted(top)
    assert "bert_tf.run_classifier" in top and "bert_tf.tasks" not in top
    not_jobs = [m for m in top if 'if __name__ == "__main__":' not in modules[m].read_text()]
    assert not not_jobs, f"library modules at the top of bert_tf/: {not_jobs}"


def test_no_library_module_imports_an_entry_point():
    graph = import_graph()
    jobs = entry_points(module_files())
    offenders = {
        module: sorted(graph[module] & jobs)
        for module in graph
        if module not in jobs and module != "bert_tf" and graph[module] & jobs
    }
    assert not offenders


def test_a_library_module_importing_an_entry_point_is_seen(tmp_path):
    # What the test above reads: a library module that imports a job has that job among its imports.
    modules = module_files()
    path = tmp_path / "registry.py"
    path.write_text(
        modules["bert_tf.tasks.registry"].read_text() + "\nfrom bert_tf import run_ner\n"
    )
    imports = imported_names("bert_tf.tasks.registry", path, modules)
    assert imports & entry_points(modules) == {"bert_tf.run_ner"}


def test_no_module_imports_itself_back():
    assert find_cycle(import_graph()) is None


def test_no_import_climbs_back_up_into_a_package_it_came_from():
    # Seen by area: a module of a subpackage never imports a module outside it that leads back in.
    areas = {}
    for module, imports in import_graph().items():
        areas.setdefault(area(module), set()).update(
            area(m) for m in imports if area(m) != area(module)
        )
    assert find_cycle(areas) is None


def test_the_house_has_at_most_nine_floors():
    graph, cache = import_graph(), {}
    floors = {module: floor_of(module, graph, cache) for module in graph}
    top = max(floors, key=floors.get)
    assert floors[top] <= MAX_FLOORS, (top, floors[top])


@pytest.mark.parametrize("job", TRAINING_JOBS)
def test_training_never_imports_the_serving_stack(job):
    graph = import_graph()
    assert not [m for m in reachable(job, graph) if m.startswith(SERVING_STACK)]


def test_the_model_directory_knows_files_and_checkpoints_only():
    assert not [m for m in reachable("bert_tf.model.model_dir", import_graph()) if ".tasks" in m]


@pytest.mark.parametrize("kind", sorted(registry.KINDS))
def test_every_task_kind_names_a_serving_module_that_exists(kind):
    module_name, class_name = registry.get(kind).serving.split(":")
    assert module_name.startswith("bert_tf.tasks.") and module_name in import_graph()
    assert isinstance(getattr(importlib.import_module(module_name), class_name), type)
