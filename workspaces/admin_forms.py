"""The admin's forms for what a workspace and a flavor store as JSON: a workspace's allowed
priorities (a list of priority class names), a flavor's node labels (an object of label keys
to values) and its tolerations (a list of Kubernetes tolerations).

The platform team edits them as what they are, not as JSON text: priorities as a choice of
the priority classes there are, labels as key and value rows, tolerations as rows of key,
operator, value, effect and seconds. A problem names the row and says what to fix. What is
stored is the JSON it always was (the same keys, in the same order), so Kueue objects, the
API and the audit log read it as before. Rows come as the form's own fields, a few empty ones
after those in use: it works without JavaScript, and a save offers more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.utils import flatatt
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from tau.k8s_names import label_key_problem, label_value_problem
from workspaces.models import PriorityClass, ResourceFlavor, Workspace

#: Empty rows offered after the ones in use.
EMPTY_ROWS = 3
#: The most rows a form takes (a flavor needs a handful).
MAX_ROWS = 100

OPERATORS = (("Equal", "Equal"), ("Exists", "Exists"))
EFFECTS = (
    ("", "any effect"),
    ("NoSchedule", "NoSchedule"),
    ("PreferNoSchedule", "PreferNoSchedule"),
    ("NoExecute", "NoExecute"),
)


class RowsWidget(forms.Widget):
    """Rows of small fields, one row per item, as a table: ``<name>-<column>-<row>`` each, and
    ``<name>-rows`` for how many rows were offered. Its value is a list of rows, each a
    mapping of column to text."""

    #: (column, heading, choices or None for a text field, input type, size)
    columns: Sequence[tuple[str, str, Sequence[tuple[str, str]] | None, str, int]] = ()

    def rows_of(self, value: Any) -> list[dict[str, str]]:
        """The rows in use, then ``EMPTY_ROWS`` empty ones."""
        rows = [dict(row) for row in value] if isinstance(value, list) else []
        return [row for row in rows if not self.is_empty(row)] + [{} for _ in range(EMPTY_ROWS)]

    def is_empty(self, row: Mapping[str, str]) -> bool:
        return not any(row.values())

    def _cell(self, name: str, column: str, index: int, heading: str, text: str, spec: Any) -> str:
        _, _, choices, kind, size = spec
        field = f"{name}-{column}-{index}"
        label = f"{heading}, row {index + 1}"
        if choices is not None:
            options = format_html_join(
                "",
                '<option value="{}"{}>{}</option>',
                (
                    (value, mark_safe(" selected") if value == text else "", words)
                    for value, words in choices
                ),
            )
            return format_html(
                '<td><select name="{}" aria-label="{}">{}</select></td>', field, label, options
            )
        return format_html(
            '<td><input type="{}" name="{}" value="{}" size="{}" aria-label="{}"></td>',
            kind,
            field,
            text,
            size,
            label,
        )

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        rows = self.rows_of(value)
        head = format_html_join("", '<th scope="col">{}</th>', ((c[1],) for c in self.columns))
        body = mark_safe(  # noqa: S308 - every cell is built by format_html
            "".join(
                format_html(
                    '<tr><th scope="row">{}</th>{}</tr>',
                    index + 1,
                    mark_safe(  # noqa: S308
                        "".join(
                            self._cell(
                                name, spec[0], index, spec[1], str(row.get(spec[0], "")), spec
                            )
                            for spec in self.columns
                        )
                    ),
                )
                for index, row in enumerate(rows)
            )
        )
        final = self.build_attrs(self.attrs, attrs)
        final["class"] = f"rows-widget {final.get('class', '')}".strip()
        return format_html(
            '<div{}><table><thead><tr><th scope="col">#</th>{}</tr></thead><tbody>{}</tbody>'
            '</table><input type="hidden" name="{}-rows" value="{}"></div>',
            flatatt(final),
            head,
            body,
            name,
            len(rows),
        )

    def value_from_datadict(self, data: Any, files: Any, name: str) -> list[dict[str, str]]:
        try:
            count = min(int(data.get(f"{name}-rows", "0")), MAX_ROWS)
        except ValueError:
            count = 0
        return [
            {column[0]: str(data.get(f"{name}-{column[0]}-{index}", "")).strip()
             for column in self.columns}
            for index in range(count)
        ]  # fmt: skip

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        return f"{name}-rows" not in data

    def id_for_label(self, id_: str) -> str:
        return ""  # the rows are labelled one by one


class LabelRowsWidget(RowsWidget):
    columns = (("key", "Label key", None, "text", 36), ("value", "Value", None, "text", 28))


class TolerationRowsWidget(RowsWidget):
    def is_empty(self, row: Mapping[str, str]) -> bool:
        return _toleration_row_empty(row)

    columns = (
        ("key", "Taint key", None, "text", 26),
        ("operator", "Operator", OPERATORS, "", 0),
        ("value", "Value", None, "text", 16),
        ("effect", "Effect", EFFECTS, "", 0),
        ("tolerationSeconds", "Seconds (NoExecute)", None, "number", 7),
    )


def _toleration_row_empty(row: Mapping[str, str]) -> bool:
    """Nothing typed: Equal is what the operator shows by itself (Exists alone, with no key,
    tolerates every taint, and is a row in use)."""
    return row.get("operator", "") in {"", "Equal"} and not any(
        text for column, text in row.items() if column != "operator"
    )


class NodeLabelsField(forms.Field):
    """Key and value rows ↔ ``{"key": "value", …}``."""

    widget = LabelRowsWidget

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str):  # a form shown again with what was sent
            return value
        if isinstance(value, Mapping):  # by key: the database keeps no order for them
            return [{"key": key, "value": text} for key, text in sorted(value.items())]
        return value

    def to_python(self, value: Any) -> dict[str, str]:
        if isinstance(value, Mapping):
            return dict(value)
        labels: dict[str, str] = {}
        problems: list[str] = []
        first_row: dict[str, int] = {}
        for number, row in enumerate(value or [], start=1):
            key, text = row.get("key", ""), row.get("value", "")
            if not key and not text:
                continue
            if not key:
                problems.append(f"Row {number}: give the label key for the value {text!r}.")
                continue
            problem = label_key_problem(key)
            if problem:
                problems.append(f"Row {number}: the key {key!r} {problem}.")
            problem = label_value_problem(text)
            if problem:
                problems.append(f"Row {number}: the value {text!r} {problem}.")
            if key in first_row:
                problems.append(
                    f"Row {number}: the key {key!r} is in row {first_row[key]} already; "
                    "a node has one value per label."
                )
            first_row.setdefault(key, number)
            labels[key] = text
        if problems:
            raise ValidationError(problems)
        return labels


class TolerationsField(forms.Field):
    """Rows of key, operator, value, effect and seconds ↔ ``[{"key": …, "operator": …}, …]``
    (the fields a row leaves empty are left out, as Kubernetes writes them)."""

    widget = TolerationRowsWidget

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list) and all(isinstance(item, Mapping) for item in value):
            return [
                {
                    column: "" if item.get(column) is None else str(item.get(column))
                    for column in ("key", "operator", "value", "effect", "tolerationSeconds")
                }
                | {"operator": str(item.get("operator") or "Equal")}
                for item in value
            ]
        return value

    def to_python(self, value: Any) -> list[dict[str, Any]]:
        tolerations: list[dict[str, Any]] = []
        problems: list[str] = []
        for number, row in enumerate(value or [], start=1):
            if _toleration_row_empty(row):
                continue
            where = f"Row {number}"
            key, operator = row.get("key", ""), row.get("operator") or "Equal"
            text, effect, seconds = (
                row.get("value", ""),
                row.get("effect", ""),
                row.get("tolerationSeconds", ""),
            )
            if operator not in {"Equal", "Exists"}:
                problems.append(f"{where}: choose the operator Equal or Exists.")
            if key:
                problem = label_key_problem(key)
                if problem:
                    problems.append(f"{where}: the taint key {key!r} {problem}.")
            elif operator == "Equal":
                problems.append(
                    f"{where}: give the taint key, or choose Exists to tolerate every taint."
                )
            if operator == "Exists" and text:
                problems.append(f"{where}: Exists takes no value; clear it or choose Equal.")
            if effect and effect not in dict(EFFECTS):
                problems.append(f"{where}: choose an effect from the list.")
            toleration: dict[str, Any] = {}
            if key:
                toleration["key"] = key
            toleration["operator"] = operator
            if text:
                toleration["value"] = text
            if effect:
                toleration["effect"] = effect
            if seconds:
                try:
                    toleration["tolerationSeconds"] = int(seconds)
                except ValueError:
                    problems.append(f"{where}: seconds must be a whole number, not {seconds!r}.")
                else:
                    if effect != "NoExecute":
                        problems.append(
                            f"{where}: seconds apply to the NoExecute effect only; clear them "
                            "or choose NoExecute."
                        )
            tolerations.append(toleration)
        if problems:
            raise ValidationError(problems)
        return tolerations


class ResourceFlavorForm(forms.ModelForm):  # type: ignore[type-arg]
    node_labels = NodeLabelsField(
        required=False,
        label="Node labels",
        help_text=(
            "The labels that select these nodes, one per row, e.g. nvidia.com/gpu.product = "
            "NVIDIA-H100-80GB-HBM3. Leave a row empty to remove it."
        ),
    )
    tolerations = TolerationsField(
        required=False,
        help_text=(
            "What these nodes' taints need from a pod, one toleration per row, e.g. key "
            "nvidia.com/gpu, Exists, effect NoSchedule. Leave a row empty to remove it."
        ),
    )

    class Meta:
        model = ResourceFlavor
        fields = ["name", "gpu_model", "node_labels", "tolerations", "description"]


class WorkspaceForm(forms.ModelForm):  # type: ignore[type-arg]
    """The workspace's allowed priorities as a choice of the priority classes there are."""

    allowed_priorities = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=(
            "The priority classes members may ask for; a run of a higher class is admitted "
            "first. Priority classes are their own list in this admin."
        ),
    )

    class Meta:
        model = Workspace
        fields = ["allowed_priorities"]  # the admin's fieldsets add the others

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        classes = list(PriorityClass.objects.order_by("value", "name").values_list("name", "value"))
        known = {name for name, _ in classes}
        kept = [
            name
            for name in (self.instance.allowed_priorities or [])
            if isinstance(name, str) and name not in known
        ]
        # A name the workspace allows that is no priority class (any more) stays a choice, so
        # that saving the form never drops it unseen.
        self.priority_choices = [(name, f"{name} ({value})") for name, value in classes] + [
            (name, f"{name} (no such priority class)") for name in kept
        ]
        field = self.fields["allowed_priorities"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = self.priority_choices
        if not self.is_bound:
            self.initial["allowed_priorities"] = list(self.instance.allowed_priorities or [])

    def clean_allowed_priorities(self) -> list[str]:
        """The names chosen, in the workspace's order where it had them (a run's rank in the
        queue follows the order of this list), the newly chosen after them by class value."""
        chosen = set(self.cleaned_data.get("allowed_priorities") or [])
        before = [name for name in (self.instance.allowed_priorities or []) if name in chosen]
        order = [name for name, _ in self.priority_choices]
        added = sorted(chosen - set(before), key=order.index)
        return before + added
