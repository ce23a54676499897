"""A RayJob's ``entrypoint`` survives every layer between the RayJob and the process Ray
starts, checked with the real shells rather than a model of them:

1. the kubelet expands ``$(NAME)`` and ``$$`` in the submitter container's args
   (modelled: Kubernetes' own algorithm, third_party/forked/golang/expansion);
2. KubeRay pastes the entrypoint into ``/bin/bash -ce "... ray job submit ... -- <it> ; ..."``
   (real ``bash``);
3. ``ray job submit`` joins the words it receives with ``subprocess.list2cmdline`` (real);
4. Ray's job supervisor runs that string with ``/bin/sh`` (real ``sh``).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executors.kubernetes.render import RenderError, ray_entrypoint

pytestmark = pytest.mark.skipif(
    not (shutil.which("bash") and shutil.which("sh")), reason="needs bash and sh"
)

# The program at the end of each shell prints the words it is given, each followed by NUL:
# printf, a builtin of both shells, gets the very words a program started there would (no
# argument holds NUL), without starting a Python twice an example.
PRINT_ARGV = "printf '%s\\0'"


def printed_words(shell: list[str]) -> list[str]:
    printed = subprocess.run(shell, check=True, capture_output=True, text=True).stdout
    assert printed.endswith("\0"), printed
    return printed[:-1].split("\0")


def kubelet_expand(text: str, env: dict[str, str] | None = None) -> str:
    """Kubernetes' expansion of container command/args (expand.go): ``$$`` → ``$``,
    ``$(NAME)`` → its value if defined (else left as written), any other ``$`` kept."""
    env = env or {}
    out: list[str] = []
    index = 0
    while index < len(text):
        character = text[index]
        if character == "$" and index + 1 < len(text):
            following = text[index + 1]
            if following == "$":
                out.append("$")
                index += 2
                continue
            if following == "(":
                closing = text.find(")", index + 2)
                if closing != -1:
                    name = text[index + 2 : closing]
                    out.append(env.get(name, f"$({name})"))
                    index = closing + 1
                    continue
                out.append("$(")
                index += 2
                continue
            out.append("$" + following)
            index += 2
            continue
        out.append(character)
        index += 1
    return "".join(out)


def through_kuberay_and_ray(entrypoint: str) -> list[str]:
    """The argument vector the program finally gets."""
    args = kubelet_expand(entrypoint, {"HOME": "/home/ray"})
    # bash: the words `ray job submit` receives after `--` (KubeRay strips surrounding space).
    words = printed_words(["bash", "-ce", f"{PRINT_ARGV} {args.strip()}"])
    command_line = subprocess.list2cmdline(words)
    return printed_words(["sh", "-c", f"{PRINT_ARGV} {command_line}"])


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py"],
        ["python", "train.py", "--steps", "1500", "--lr=1e-3"],
        ["python", "train.py", "--name", "my run"],
        ["python", "train.py", "--name", "two  spaces", " lead", "trail "],
        ["python", "train.py", "it's", 'say "hi"', '"\'"', "'", '"', ""],
        ["python", "train.py", "$HOME", "$(HOME)", "$$", "`id`", "$(id)"],
        ["python", "train.py", "back\\slash", "\\", '\\"', "\\'", "a\\ b", "end\\"],
        ["python", "train.py", "*.py", "a;b", "a&&b", "a|b", "<x>", "(y)", "#z", "~", "{a,b}"],
        ["python", "train.py", "line one\nline two", "naïve ünïcode", "émoji 🚀"],
        ["torchrun", "--nproc-per-node", "8", "train.py", "--epochs", "3"],
    ],
)
def test_arguments_arrive_unchanged(argv: list[str]) -> None:
    assert through_kuberay_and_ray(ray_entrypoint(argv)) == argv


# Anything a tau.yaml argument may hold: no TAB (refused for RayJobs), no other control
# characters but newline (the schema refuses them), no NUL.
_ARGUMENT_CHARACTERS = st.characters(
    blacklist_categories=["Cs"],
    blacklist_characters="\t\x00\r\x0b\x0c\x85\u2028\u2029",
    min_codepoint=0x0A,
).filter(lambda character: character == "\n" or character.isprintable())


@settings(max_examples=60, deadline=None)
@given(
    arguments=st.lists(
        st.one_of(
            st.text(alphabet=" '\"\\$`*;&|()<>#~{}!?[]=\n-_./ab", max_size=12),
            st.text(alphabet=_ARGUMENT_CHARACTERS, max_size=12),
        ),
        max_size=5,
    )
)
def test_any_argument_arrives_unchanged(arguments: list[str]) -> None:
    argv = ["python", "train.py", *arguments]
    assert through_kuberay_and_ray(ray_entrypoint(argv)) == argv


def test_a_tab_is_refused_rather_than_mangled() -> None:
    with pytest.raises(RenderError, match="TAB"):
        ray_entrypoint(["python", "train.py", "a\tb"])
