"""A model field for Kubernetes quantities, typed the way people write them ("64Gi", "500m")."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import models

from tau.quantity import QuantityError, format_quantity, parse_quantity

_GIBIBYTE = 2**30


class QuantityFormField(forms.CharField):
    """Accepts ``8``, ``500m``, ``1.5``, ``64Gi``; shows stored values the same way back."""

    def to_python(self, value: Any) -> Decimal | None:  # type: ignore[override]
        text = super().to_python(value)
        if text is None or text in self.empty_values:
            return None
        try:
            return parse_quantity(text)
        except QuantityError as exc:
            raise ValidationError(str(exc), code="invalid") from None

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, Decimal):
            # Large whole byte counts read better in binary units (68719476736 → 64Gi).
            binary = value >= _GIBIBYTE and value % (2**20) == 0
            return format_quantity(value, binary=binary)
        return value


class QuantityField(models.DecimalField[Any, Any]):
    """An exact amount in base units (cores, bytes, devices), up to a billion gibibytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_digits", 30)
        kwargs.setdefault("decimal_places", 3)
        super().__init__(*args, **kwargs)

    def formfield(
        self, form_class: Any = None, choices_form_class: Any = None, **kwargs: Any
    ) -> Any:
        # Skip DecimalField.formfield, which would force a numeric form field.
        return models.Field.formfield(
            self,
            form_class=form_class or QuantityFormField,
            choices_form_class=choices_form_class,
            **kwargs,
        )
