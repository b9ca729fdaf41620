#!/usr/bin/env python3
"""Verifies a relaybus webhook signature with the independent Standard Webhooks
implementation from PyPI (pip install standardwebhooks).

usage: verify_signature.py SECRET MSG_ID TIMESTAMP BODY_FILE SIGNATURE_HEADER
exit 0: verified, 1: rejected, 77: the standardwebhooks package is missing.
"""
import sys

try:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError
except ImportError:
    print("standardwebhooks is not installed")
    sys.exit(77)

secret, msg_id, timestamp, body_file, signature = sys.argv[1:6]
with open(body_file, "rb") as f:
    body = f.read()
headers = {
    "webhook-id": msg_id,
    "webhook-timestamp": timestamp,
    "webhook-signature": signature,
}
try:
    Webhook(secret).verify(body, headers, json_parse=False)
except WebhookVerificationError as e:
    print("rejected:", e)
    sys.exit(1)
sys.exit(0)
