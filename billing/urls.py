from django.urls import path

from billing import views

urlpatterns = [
    path("api/invoices", views.create_invoice, name="billing-create-invoice"),
    path("api/invoices/<int:invoice_id>", views.invoice_detail, name="billing-invoice"),
    path("api/invoices/<int:invoice_id>/pay", views.pay_invoice, name="billing-pay"),
]
