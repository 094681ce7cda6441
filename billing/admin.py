"""Billing in the admin: invoices are created here and voided through the billing service; what
the service decides (status, amount, currency, number) is never edited by hand, and payments and
receipts, written only by the service and its jobs, are read-only. An edit that bypassed the
service would skip its row lock and its cache invalidation, and could leave an invoice that the
API then answers wrongly (open again, yet with a payment)."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from billing.api import ApiError
from billing.errors import BillingError
from billing.models import ApiToken, Invoice, Payment, Receipt
from billing.services import invoice_cache_key
from billing.validation import AMOUNT
from billing.views import INVOICE_FIELDS
from billing.wiring import default_service
from composition.admin import ReadOnlyRows

# Fields only the billing service changes (on an invoice that exists).
SERVICE_OWNED_FIELDS = ("number", "amount_cents", "currency", "status")


class InvoiceForm(forms.ModelForm):
    """The API's rules for a new invoice, so that the admin cannot write one the API would refuse
    (or that the database's constraints would reject with a 500)."""

    class Meta:
        model = Invoice
        fields = "__all__"

    def clean_amount_cents(self) -> int:
        amount = self.cleaned_data["amount_cents"]
        if not AMOUNT.minimum <= amount <= AMOUNT.maximum:
            raise forms.ValidationError(f"must be from {AMOUNT.minimum} to {AMOUNT.maximum} cents")
        return int(amount)

    def _api_rule(self, name: str) -> str:
        value = self.cleaned_data[name]
        if not value:  # an optional field left blank (a required one was refused by its form field)
            return str(value)
        try:  # the API's own rule for the field
            return str(INVOICE_FIELDS[name].parse(name, value))
        except ApiError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_number(self) -> str:
        return self._api_rule("number")

    def clean_customer(self) -> str:
        return self._api_rule("customer")

    def clean_email(self) -> str:
        return self._api_rule("email")

    def clean_currency(self) -> str:
        return self._api_rule("currency")


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    form = InvoiceForm
    list_display = ("number", "customer", "amount_cents", "currency", "status", "updated_at")
    list_filter = ("status", "currency")
    search_fields = ("number", "customer")
    actions = ["void_selected"]

    def get_readonly_fields(self, request: HttpRequest, obj: Invoice | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("status",)  # a new invoice is open
        return (*SERVICE_OWNED_FIELDS, "created_at", "updated_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # an invoice is voided, never deleted

    def save_model(self, request: HttpRequest, obj: Invoice, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change:
            # Customer or email changed: the cached answer goes after COMMIT (the admin's
            # view runs in a transaction).
            default_service().cache.invalidate(invoice_cache_key(obj.pk))

    @admin.action(description="Void selected open invoices", permissions=["change"])
    def void_selected(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
        voided, refused = 0, []
        for invoice_id in queryset.values_list("pk", flat=True):
            try:
                _, changed = default_service().void_invoice(invoice_id)
            except BillingError as exc:
                refused.append(str(exc))
                continue
            voided += changed
        if voided:
            self.message_user(request, f"{voided} invoice(s) voided.", messages.SUCCESS)
        if refused:
            self.message_user(request, f"{len(refused)} not voided: {'; '.join(refused[:10])}", messages.WARNING)
        if not voided and not refused:
            self.message_user(request, "Nothing to void: the selected invoices were void already.", messages.INFO)


@admin.register(Payment)
class PaymentAdmin(ReadOnlyRows, admin.ModelAdmin):
    list_display = ("payment_id", "invoice", "amount_cents", "created_at")
    search_fields = ("payment_id", "invoice__number")


@admin.register(Receipt)
class ReceiptAdmin(ReadOnlyRows, admin.ModelAdmin):
    list_display = ("number", "payment", "created_at")
    search_fields = ("number", "payment__payment_id")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are listed and revoked (deleted) here; made with ``manage.py create_api_token``,
    since only then can the token itself be shown."""

    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "expires_at")
    search_fields = ("name", "user__username", "prefix")
    # expires_at stays editable: an operator can end a token early, or keep it a while longer.
    readonly_fields = ("user", "name", "prefix", "created_at", "last_used_at")

    def has_add_permission(self, request: object) -> bool:
        return False
