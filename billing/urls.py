from django.urls import path

from billing import views

urlpatterns = [
    path("api/invoices", views.invoices, name="billing-invoices"),
    path("api/invoices/<int:invoice_id>", views.invoice, name="billing-invoice"),
    path("api/invoices/<int:invoice_id>/pay", views.invoice_pay, name="billing-pay"),
    path("api/invoices/<int:invoice_id>/void", views.invoice_void, name="billing-void"),
    path("api/invoices/<int:invoice_id>/remind", views.invoice_remind, name="billing-remind"),
]
