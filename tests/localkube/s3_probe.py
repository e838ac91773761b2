"""S3 requests for the host and for a pod of the trainer image (which runs this file as its
script). :func:`ask` needs no client library: anonymous, or with SigV4 headers carrying an access
key and a signature of zeros; the server looks the key up before it checks the signature, so its
answer names which of the two is wrong. Run as a script, it asks the server at
``$AWS_ENDPOINT_URL`` what the tests compare, then writes, lists and reads ``$KEY`` with boto3
configured by the environment alone (as the trainer's is), and prints one JSON line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
import urllib.error
import urllib.request


def ask(url: str, key: str | None = None) -> list:
    """``[status, body]`` of a GET, or ``[status, S3 error code]`` when it fails."""
    headers = {}
    if key:
        amz = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers = {
            "x-amz-date": amz,
            "x-amz-content-sha256": hashlib.sha256(b"").hexdigest(),
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential={key}/{amz[:8]}/us-east-1/s3/aws4_request, "
                "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=" + "0" * 64
            ),
        }
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        code = re.search(r"<Code>(.*?)</Code>", e.read().decode())
        return [e.code, code.group(1) if code else None]


def main() -> None:
    url = os.environ["AWS_ENDPOINT_URL"]
    bucket = f"{url}/{os.environ['BUCKET']}"
    print(
        json.dumps(
            {
                "address": socket.gethostbyname(url.split("//")[1].split(":")[0]),
                "health": ask(url + os.environ["HEALTH_PATH"]),
                "anonymous": ask(bucket),
                "unknown_key": ask(bucket, "nobody"),
                "wrong_secret": ask(bucket, os.environ["AWS_ACCESS_KEY_ID"]),
                **_with_boto3(os.environ["BUCKET"], os.environ["KEY"]),
            }
        )
    )


def _with_boto3(bucket: str, key: str) -> dict:
    import boto3

    client = boto3.client("s3")  # endpoint, region, credentials: the environment's
    client.put_object(Bucket=bucket, Key=key, Body=b"written in a pod")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key.rsplit("/", 1)[0] + "/")
    return {
        "listed": [o["Key"] for o in listed.get("Contents", [])],
        "read": client.get_object(Bucket=bucket, Key=key)["Body"].read().decode(),
    }


if __name__ == "__main__":
    main()
