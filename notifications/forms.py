"""Forms of the notification pages."""

from __future__ import annotations

from django import forms

from notifications.events import EVENTS
from notifications.models import PayloadFormat
from notifications.services import SECRET_MAX_LENGTH, SECRET_MIN_LENGTH

EVENT_CHOICES = [(name, f"{name}: {words}") for name, words in EVENTS.items()]


class WebhookForm(forms.Form):
    url = forms.URLField(
        max_length=2000,
        label="URL",
        assume_scheme="https",
        widget=forms.TextInput(attrs={"inputmode": "url", "autocomplete": "url"}),
        help_text="Where to POST each event: https://, a public address. Redirects are not "
        "followed.",
    )
    secret = forms.CharField(
        min_length=SECRET_MIN_LENGTH,
        max_length=SECRET_MAX_LENGTH,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Signs every delivery (X-TauGrid-Signature); e.g. the output of "
        "`openssl rand -hex 32`. It is never shown again.",
    )
    events = forms.MultipleChoiceField(
        choices=EVENT_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple(attrs={"class": "event-choices"}),
        help_text="None ticked: every event.",
    )
    format = forms.ChoiceField(
        choices=PayloadFormat.choices, initial=PayloadFormat.JSON, required=False
    )

    def clean_format(self) -> str:
        return str(self.cleaned_data.get("format") or PayloadFormat.JSON)


class EmailPreferencesForm(forms.Form):
    events = forms.MultipleChoiceField(
        choices=EVENT_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple(attrs={"class": "event-choices"}),
        label="E-mail me when",
        help_text="Run events are about runs you submitted; budget.threshold goes to the "
        "admins of the workspace.",
    )
