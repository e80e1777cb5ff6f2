"""Networks from model description files: ``path/to/file.py:function`` -> ``nn.Module``.

A description file is plain Python that defines a factory function returning an
``nn.Module`` (randomly initialised, no weights downloaded); if the function takes a
``num_classes`` argument it receives the configured class count. A spec is either
``models/imagenet/tiny_nets.py:tiny_vgg`` (a path relative to the config file) or
``tiny_nets:tiny_vgg`` (a module in ``<models_dir>/imagenet/``). On the command line (``--network``,
:func:`describe_factory`) a spec is ``path/to/file.py:function``, relative to the current folder.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Factory", "parse_factory", "load_factory", "build_factory_model", "COMMAND_LINE_FACTORY",
           "check_factory", "describe_factory", "factory_data"]


@dataclass(frozen=True)
class Factory:
    """One factory: the spec as written, the resolved file and the function's name."""

    spec: str
    path: Path
    function: str

    @property
    def name(self) -> str:
        """The network (family) name: the function's name."""
        return self.function

    @property
    def source(self) -> str:
        return f"factory:{self.spec}"

    @property
    def code_files(self) -> tuple[Path, ...]:
        """The files whose bytes key what is cached of this factory's network: its own file, the Python files beside
        it, which it may import (``_import``), those of each package beside it that any of these imports (``from
        blocks import layers``: ``blocks/**/*.py``), and those of each module or package found elsewhere on
        ``sys.path`` (``PYTHONPATH``, an editable install) that any of them imports: :func:`_own_module_files`."""
        folder = self.path.parent
        files = {self.path, *folder.glob("*.py")}
        todo, modules = list(files), set()
        while todo:
            for name in _imported_modules(todo.pop()) - modules:
                modules.add(name)
                found = set(_own_module_files(name, folder)) - files
                files |= found
                todo.extend(found)
        # a name that is no file is passed over (an editor's lock file, .#net.py, is a link to nowhere), as
        # files.sources_sha256 does: the key of what reads them could not be made (describe_factory ended in OSError)
        return tuple(sorted(f for f in files if f == self.path or f.is_file()))


def parse_factory(spec: str, root: Path, models_dir: Path | None = None) -> Factory:
    """Resolve ``spec`` against ``root`` (the config's folder) or ``models_dir/imagenet``."""
    module, sep, function = spec.rpartition(":")
    if not sep or not module or not function.isidentifier():
        raise UserError(f"factory '{spec}': expected 'path/to/file.py:function' or 'module:function'")
    if module.endswith(".py") or "/" in module or "\\" in module:
        from perf4sight.config import expand_home  # a ~user of no user: one line

        path = expand_home(module)
        path = path if path.is_absolute() else root / path
    else:
        path = (models_dir or root / "models") / "imagenet" / f"{module.replace('.', '/')}.py"
    if not path.is_file():
        raise UserError(f"factory '{spec}': file not found: {path}")
    return Factory(spec, path.resolve(), function)


#: An import statement: ``from MODULE import ...`` or ``import A.B as C, D``, at a line's start or after a ``;`` or
#: a ``:`` (``import a; import b``, ``try: import b``, ``if c: from b import d``), read from lines whose continuations
#: (a ``\`` at the end) are joined (:data:`_CONTINUED`)
_IMPORT_LINE = re.compile(rb"(?:^|[;:])[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b|import[ \t]+([^\n#;]+))", re.M)
_CONTINUED = re.compile(rb"\\\r?\n")


@functools.lru_cache(maxsize=None)
def _imported_modules(path: Path) -> frozenset[str]:
    """The top-level modules the import statements of the Python file ``path`` name (absolute imports), read once
    per process, as the file itself is imported once (:func:`_import`); none for a file that cannot be read. Read
    from its lines, not parsed: 30 times faster on a large package of the user's (0.08 s for 374 files against 2.8
    s), where a line of a string that reads like an import adds a name (a file more in a key, never one less)."""
    try:
        data = path.read_bytes()
    except OSError:
        return frozenset()
    names = set()
    for module, listed in _IMPORT_LINE.findall(_CONTINUED.sub(b" ", data)):
        if module:  # from X import ...; a relative import (from . import x, from .x import y) names none
            names.add(module.split(b".")[0])
        else:
            names.update(part.split()[0].split(b".")[0] for part in listed.split(b",") if part.split())
    return frozenset(n for n in (b.decode("utf-8", "replace") for b in names) if n.isidentifier())


def _own_module_files(name: str, folder: Path) -> tuple[Path, ...]:
    """The Python files of the top-level module ``name`` that a file in ``folder`` imports, where they are a user's:
    a package beside it (``folder/name/**/*.py``; a module beside it is among the files beside it already), and the
    module or package the import finds on ``sys.path`` outside Python's own library, the installed packages and
    perf4sight (none for those, for a built-in module, or for a name not found: an import that fails says so)."""
    beside = tuple((folder / name).rglob("*.py")) if (folder / name).is_dir() else ()
    return beside + tuple(f for p in _users_places(name) for f in (p.rglob("*.py") if p.is_dir() else [p]))


@functools.lru_cache(maxsize=None)
def _users_places(name: str) -> tuple[Path, ...]:
    """Where the import finds the top-level module ``name`` on ``sys.path`` (its file, or its package's folders),
    outside Python's own library, the installed packages and perf4sight. Found once per process, before any factory
    that imports it is imported in every stage: a module found on a folder a factory's file puts on ``sys.path``
    itself is found only after, and the networks stage, which imports the factory, hashed other code files for
    manifest-settings.json than the profile stage, which does not (so that stage said [networks] had changed)."""
    try:  # the factory's folder comes last on sys.path (_import): a module of that name elsewhere is the one imported
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a module whose __spec__ is unset, a name that is not one
        spec = None
    if spec is None:
        return ()
    places = [Path(p) for p in spec.submodule_search_locations or ()] or \
        ([Path(spec.origin)] if spec.origin and spec.has_location else [])
    return tuple(p.resolve() for p in places if not _not_a_users(p.resolve()))


@functools.lru_cache(maxsize=1)
def _library_folders() -> tuple[Path, ...]:
    """Where Python's own library, the installed packages (the environment's, the user's site) and perf4sight live."""
    import site
    import sysconfig

    folders = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders |= set(getattr(site, "getsitepackages", lambda: [])()) | {site.getusersitepackages()}
    folders |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    folders.add(str(Path(__file__).resolve().parents[1]))  # perf4sight/: its code keys the caches already
    return tuple(Path(f).resolve() for f in folders if f)


def _not_a_users(path: Path) -> bool:
    """True where ``path`` is under one of :func:`_library_folders`."""
    return any(path == f or f in path.parents for f in _library_folders())


def _check_own_helpers(factory: Factory) -> None:
    """``UserError`` where a module beside the factory's file that the file imports (its import statements) was
    imported from another factory's folder instead (two folders' ``common.py``: one process imports a name once, from
    the first folder on ``sys.path``), which would build the network from the other folder's code."""
    folder = factory.path.parent
    imported = _imported_modules(factory.path)
    for helper in sorted(p for p in folder.glob("*.py") if p.stem in imported):
        loaded = getattr(sys.modules.get(helper.stem), "__file__", None)
        if loaded and Path(loaded).resolve().parent != folder and str(Path(loaded).resolve().parent) in sys.path:
            raise UserError(f"factory '{factory.spec}': its {helper.name} is shadowed by {loaded}, imported for "
                            f"another factory under the same name: give the helper modules distinct names")


@contextlib.contextmanager
def _as_a_script(factory: Factory):
    """``sys.argv`` as the factory's file sees it run as a script with no arguments (``[file]``), put back after:
    research code often parses its command line as it is imported or builds (``parser.parse_args()`` at module
    level), and read perf4sight's own arguments then, failing on them (argparse's usage line, naming ``main.py``,
    read as perf4sight's) or taking them for its own."""
    saved = sys.argv
    sys.argv = [str(factory.path)]
    try:
        yield
    finally:
        sys.argv = saved


def _import(factory: Factory) -> ModuleType:
    """The factory's file as a module, imported once per process. Its folder is appended to ``sys.path``, so the
    modules beside it that it imports are found, as when the file is run as a script (after the installed
    packages: a file named like one of those does not shadow it; one named like another factory's helper is refused:
    :func:`_check_own_helpers`)."""
    name = "perf4sight_models_" + re.sub(r"\W", "_", str(factory.path))
    if name in sys.modules:
        return sys.modules[name]
    if str(factory.path.parent) not in sys.path:
        sys.path.append(str(factory.path.parent))
    module_spec = importlib.util.spec_from_file_location(name, factory.path)
    if module_spec is None or module_spec.loader is None:
        raise UserError(f"factory '{factory.spec}': {factory.path} is not an importable Python file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        with _as_a_script(factory):
            module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a user file can raise anything while importing, sys.exit() included
        raise UserError(f"factory '{factory.spec}': {factory.path} fails to import "
                        f"({_first_line(exc)}){_in_a_package(factory, exc)}") from None
    _check_own_helpers(factory)
    sys.modules[name] = module
    return module


def _in_a_package(factory: Factory, exc: BaseException) -> str:
    """Where an import failed in a file of a package (its folder has ``__init__.py``: ``from .layers import block``, or
    ``from mypkg.layers import ...`` read from the folder above), what to give instead: the file is imported as a
    script is run, not as the package's module, so a file outside the package that imports it. "" otherwise."""
    if not isinstance(exc, ImportError) or not (factory.path.parent / "__init__.py").is_file():
        return ""
    top = factory.path.parent
    while (top.parent / "__init__.py").is_file() and top.parent != top:
        top = top.parent
    missing = getattr(exc, "name", None) or ""  # a ModuleNotFoundError's module: the package's own, or another's
    relative = "relative import" in str(exc)
    if not relative and missing.split(".")[0] != top.name:  # a library not installed: no word of the package
        return ""
    module = ".".join(factory.path.relative_to(top.parent).with_suffix("").parts)
    return (f"; it is a module of the package {top.name} (its folder has __init__.py), and a factory's file is "
            f"imported as a script is run, outside its package: give a file in {top.parent} that imports it, such as "
            f"one holding `from {module} import {factory.function}`, as FILE.py:{factory.function}")


def _first_line(exc: BaseException) -> str:
    """``Type: message`` of a user's exception, its message's first line alone (an error is one line)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def load_factory(factory: Factory) -> Callable[..., nn.Module]:
    """The factory function; ``UserError`` if the file fails to import or lacks it."""
    module = _import(factory)
    fn = getattr(module, factory.function, None)
    if not callable(fn):
        own = {n: v for n, v in vars(module).items() if getattr(v, "__module__", None) == module.__name__
               and not n.startswith("_")}
        found = sorted(n for n, v in own.items() if inspect.isfunction(v))
        from torch import nn  # the file imported it: a class of its own that builds the network is named too

        classes = sorted(n for n, v in own.items() if inspect.isclass(v) and issubclass(v, nn.Module))
        more = f"; nn.Module classes: {', '.join(classes)}" if classes else ""
        raise UserError(f"factory '{factory.spec}': {factory.path.name} has no function '{factory.function}' "
                        f"(functions: {', '.join(found) or 'none'}{more})")
    return fn


def build_factory_model(factory: Factory, num_classes: int = 1000) -> nn.Module:
    """Call the factory (passing ``num_classes`` when it accepts it) and check the result."""
    fn = load_factory(factory)
    try:
        accepts = "num_classes" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepts = False
    try:
        with _as_a_script(factory):
            model = fn(num_classes=num_classes) if accepts else fn()
    except (Exception, SystemExit) as exc:  # sys.exit("msg") in a factory: named, not the CLI's exit
        raise UserError(f"factory '{factory.spec}': calling {factory.function}() failed "
                        f"({_first_line(exc)})") from None
    _check_own_helpers(factory)  # a helper it imports only when called
    from torch import nn  # only here: parsing a spec (parse_factory) needs no torch

    if isinstance(model, type) and issubclass(model, nn.Module):  # ``return Net`` for ``return Net()``
        raise UserError(f"factory '{factory.spec}': {factory.function}() returned the class {model.__name__}, not a "
                        f"torch.nn.Module made of it: return {model.__name__}(...)")
    if not isinstance(model, nn.Module):
        raise UserError(f"factory '{factory.spec}': {factory.function}() returned {type(model).__name__}, "
                        "not a torch.nn.Module")
    return model


#: ``path/to/file.py:function``: a factory named on the command line (``--network``), a file relative to the
#: current folder (a bare ``module:function`` there would read as a network's name)
COMMAND_LINE_FACTORY = re.compile(r".+\.py:[A-Za-z_]\w*")


def check_factory(factory: Factory) -> None:
    """``UserError`` (that of :func:`load_factory`) unless ``factory``'s file defines its function: seen in the
    file's syntax tree where it is written there (a ``def``, a class, an assignment or an import: no import of the
    file, so no torch), else by importing the file."""
    try:
        tree = ast.parse(factory.path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        tree = ast.Module(body=[], type_ignores=[])
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.asname or a.name.split(".")[0] for a in node.names]
        else:
            continue
        if factory.function in names:
            return
    load_factory(factory)


def describe_factory(spec: str, input_shape: list[int], num_classes: int,
                     cache_dir: Path | None = None) -> NetworkDescription:
    """The description of the network ``spec`` (``path/to/file.py:function``, relative to the current folder)
    builds, at ``input_shape`` ([C, H, W]), named after the function. With ``cache_dir`` it is cached there,
    keyed by the bytes of the file, of the Python files beside it and of the user's modules they import
    (``Factory.code_files``: an edited file is described anew), the name, size and time of its other files beside it
    (``factory_data``: a widths file it reads), the shape, the class count and the library versions, so a second
    request imports no torch."""
    from perf4sight.networks.zoo import cache_file, cached_description

    factory = parse_factory(spec, Path.cwd())
    data = factory_data(factory.path)
    path = None if cache_dir is None or data is None else cache_file(
        cache_dir, factory.name, input_shape, num_classes, settings=(factory.source,) + data, code=factory.code_files)
    return cached_description(path, lambda: _describe_built(factory, input_shape, num_classes))


def factory_data(path: Path) -> tuple[list[list[object]], ...] | None:
    """The other files beside factory file ``path`` by name, size and time (``stage_cache.data_files``: a data file
    it reads, such as its widths), as settings to add to the key of what is cached of its network: ``()`` where there
    are none (the key it always had), None where the folder cannot be listed (then nothing is cached)."""
    from perf4sight.networks.stage_cache import data_files  # no torch

    try:
        files = data_files(path.parent)
    except OSError:
        return None
    return (files,) if files else ()


def _describe_built(factory: Factory, input_shape: list[int], num_classes: int) -> NetworkDescription:
    import torch

    from perf4sight.ir.from_torch import describe

    info = dict(name=factory.name, network=factory.name, source=factory.source)
    load_factory(factory)  # its file imported outside the meta device: tensors made at import stay real
    try:
        with torch.device("meta"):  # shapes only: no weights initialised
            model = build_factory_model(factory, num_classes)
        return describe(model, input_shape, **info)
    except (UserError, NotImplementedError):  # a factory or an op that needs real tensors: a real model instead
        return describe(build_factory_model(factory, num_classes), input_shape, **info)
