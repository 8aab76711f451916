"""Registry.build reports bad parameters only when they do not fit the builder's signature (issue 30)."""

import pytest

from privdl.errors import ValidationError
from privdl.network.topology import make_graph
from privdl.registry import Registry


def _registry() -> Registry:
    registry: Registry = Registry("widget")

    @registry.register("buggy")
    def buggy(n: int, *, size: int = 1) -> None:
        raise TypeError("an internal bug about an argument")

    @registry.register("fine")
    def fine(n: int, *, size: int = 1) -> tuple[int, int]:
        return n, size

    @registry.register("klass")
    class Klass:
        def __init__(self, n: int, *, size: int = 1) -> None:
            self.n, self.size = n, size

    return registry


def test_a_type_error_inside_the_builder_propagates_unchanged():
    with pytest.raises(TypeError, match="an internal bug about an argument") as info:
        _registry().build("buggy", 3, size=2)
    assert not isinstance(info.value, ValidationError)


@pytest.mark.parametrize("name", ["buggy", "fine", "klass"])
def test_an_unknown_keyword_is_a_bad_parameters_error(name):
    with pytest.raises(ValidationError, match=rf"bad parameters for widget '{name}': .*unexpected keyword.*'colour'"):
        _registry().build(name, 3, colour="red")


def test_a_missing_or_extra_argument_is_a_bad_parameters_error():
    registry = _registry()
    with pytest.raises(ValidationError, match="bad parameters for widget 'fine'"):
        registry.build("fine")
    with pytest.raises(ValidationError, match="bad parameters for widget 'fine'"):
        registry.build("fine", 1, 2)


def test_parameters_that_fit_are_passed_through():
    registry = _registry()
    assert registry.build("fine", 3, size=2) == (3, 2)
    built = registry.build("klass", 4, size=5)
    assert (built.n, built.size) == (4, 5)


def test_a_real_registry_still_names_the_concept():
    with pytest.raises(ValidationError, match="bad parameters for topology 'ring'"):
        make_graph("ring", 4, no_such_option=1)


def test_a_class_forwarding_keywords_to_its_base_is_checked_against_the_base():
    registry: Registry = Registry("widget")

    class Base:
        def __init__(self, *, steps: int, clip: float = 1.0) -> None:
            self.steps, self.clip = steps, clip

    @registry.register("child")
    class Child(Base):
        def __init__(self, *, steps: int, sigma: float = 0.0, **kwargs: object) -> None:
            super().__init__(steps=steps, **kwargs)  # type: ignore[arg-type]
            self.sigma = sigma

    built = registry.build("child", steps=2, sigma=0.5, clip=3.0)
    assert (built.steps, built.sigma, built.clip) == (2, 0.5, 3.0)
    with pytest.raises(ValidationError, match=r"bad parameters for widget 'child': .*'clipp'"):
        registry.build("child", steps=2, clipp=3.0)


def test_a_registered_mechanism_with_forwarded_keywords_still_says_bad_parameters():
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network

    network = Network.from_topology("ring", 4)
    with pytest.raises(ValidationError, match=r"bad parameters for mechanism 'ldp': .*'no_such_option'"):
        make_mechanism("ldp", steps=3, network=network, sigma=1.0, no_such_option=1)
    assert make_mechanism("ldp", steps=3, network=network, sigma=1.0, clip=2.0) is not None
