"""`@stop` and `@cleanup`: mark methods of a MultiTurnEnv as stop conditions and rollout cleanups.

The same decorators as verifiers' classic API, so an environment that declares
`@vf.stop async def solved(self, state) -> bool` ports by changing its import. A stop condition
is checked after every model turn (and once before the first); the first that returns true ends
the rollout and its method name becomes the rollout's `stop_condition`. Cleanups run after every
rollout, however it ended. Higher `priority` runs first; ties go by method name.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from types import MethodType
from typing import Any, Generic, TypeVar, overload

V = TypeVar("V")

F = TypeVar("F", bound=Callable[..., Any])

_STOP = "_workbench_stop_priority"
_CLEANUP = "_workbench_cleanup_priority"


def _marker(attribute: str, func: F | None, priority: int) -> F | Callable[[F], F]:
    def mark(f: F) -> F:
        setattr(f, attribute, priority)
        return f

    return mark if func is None else mark(func)


@overload
def stop(func: F, priority: int = 0) -> F: ...
@overload
def stop(func: None = None, priority: int = 0) -> Callable[[F], F]: ...
def stop(func: F | None = None, priority: int = 0) -> F | Callable[[F], F]:
    """Mark a method `(self, state) -> bool` (sync or async) as a stop condition.

    Use bare (`@stop`) or with a priority (`@stop(priority=10)`). Conditions with priority >= 0
    are checked before the environment's own `is_completed` and `max_turns`, negative ones after.
    """
    return _marker(_STOP, func, priority)


@overload
def cleanup(func: F, priority: int = 0) -> F: ...
@overload
def cleanup(func: None = None, priority: int = 0) -> Callable[[F], F]: ...
def cleanup(func: F | None = None, priority: int = 0) -> F | Callable[[F], F]:
    """Mark a method `(self, state) -> None` (sync or async) to run after each rollout ends."""
    return _marker(_CLEANUP, func, priority)


def _decorated(obj: object, attribute: str) -> list[tuple[int, str, Callable[..., Any]]]:
    """(priority, name, bound method) of `obj`'s methods carrying `attribute`, highest priority first.

    Looks at class attributes only, so properties are never evaluated on the way.
    """
    found: list[tuple[int, str, Callable[..., Any]]] = []
    for name in dir(type(obj)):
        member = inspect.getattr_static(type(obj), name, None)
        func = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        if callable(func) and hasattr(func, attribute):
            found.append((getattr(func, attribute), name, getattr(obj, name)))
    found.sort(key=lambda entry: (-entry[0], entry[1]))
    return found


def stop_conditions(obj: object) -> list[tuple[int, str, Callable[..., Any]]]:
    return _decorated(obj, _STOP)


def cleanups(obj: object) -> list[tuple[int, str, Callable[..., Any]]]:
    return _decorated(obj, _CLEANUP)


class PerFunction(Generic[V]):
    """`read(func)`, remembered per function: signatures are read once, not per rollout
    (`inspect.signature` was about a tenth of the engine's CPU). Weak keys, so a function that
    goes away (a rubric built for one GEPA candidate, say) takes its entry with it. A bound method
    is remembered by the function it binds (its signature is that function's less the first
    argument, whatever the object), so `obj.method` fetched anew, or on another object, still
    hits; a partial or a callable object is its own key. A callable that cannot be a weak key
    (unhashable, or no weak references) is simply read every time."""

    def __init__(self, read: Callable[[Callable[..., Any]], V]) -> None:
        self.read = read
        self._functions: weakref.WeakKeyDictionary[Any, V] = weakref.WeakKeyDictionary()
        self._methods: weakref.WeakKeyDictionary[Any, V] = weakref.WeakKeyDictionary()

    def __call__(self, func: Callable[..., Any]) -> V:
        cache, key = (
            (self._methods, func.__func__) if isinstance(func, MethodType) else (self._functions, func)
        )
        try:
            return cache[key]
        except KeyError:
            value = self.read(func)
            try:
                cache[key] = value
            except TypeError:
                pass
            return value
        except TypeError:  # unhashable, or cannot be weakly referenced
            return self.read(func)


def _read_named(func: Callable[..., Any]) -> frozenset[str] | None:
    """What a hook names; None: it takes **kwargs."""
    params = inspect.signature(func).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


_named = PerFunction(_read_named)  # each hook's names, once per function rather than every turn


async def call_with_named_args(func: Callable[..., Any], **available: Any) -> Any:
    """Call `func` with those of `available` it names (all of them if it takes **kwargs); await
    the result when it is awaitable. Lets a hook declare only the arguments it uses."""
    names = _named(func)
    kwargs = available if names is None else {k: v for k, v in available.items() if k in names}
    result = func(**kwargs)
    return await result if inspect.isawaitable(result) else result
