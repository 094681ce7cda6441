from django.urls import path, re_path

from billing import views
from billing.api import not_found

urlpatterns = [
    path("api/invoices", views.invoices, name="billing-invoices"),
    path("api/invoices/<int:invoice_id>", views.invoice, name="billing-invoice"),
    path("api/invoices/<int:invoice_id>/pay", views.invoice_pay, name="billing-pay"),
    path("api/invoices/<int:invoice_id>/void", views.invoice_void, name="billing-void"),
    path("api/invoices/<int:invoice_id>/remind", views.invoice_remind, name="billing-remind"),
    # Last: any other path under /api/ (an id that is not a number, a trailing slash) is a JSON
    # 404, not Django's HTML page.
    re_path(r"^api(?:/|$)", not_found, name="billing-not-found"),
]
