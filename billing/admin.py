from django.contrib import admin

from billing.models import ApiToken, Invoice, Payment, Receipt


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("number", "customer", "amount_cents", "currency", "status", "updated_at")
    list_filter = ("status", "currency")
    search_fields = ("number", "customer")


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ("payment_id", "invoice", "amount_cents", "created_at")
    search_fields = ("payment_id", "invoice__number")
    readonly_fields = ("payment_id", "invoice", "amount_cents", "created_at")


@admin.register(Receipt)
class ReceiptAdmin(admin.ModelAdmin):
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
