"""GET (or POST a JSON body to) a local deepserve server and print the response body; exit 1 on
an error (the GPU machine may lack curl).  http_get.py PORT PATH [JSON_BODY]"""
import sys
import urllib.request

port, path = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=300) as r:
        sys.stdout.write(r.read().decode())
except Exception as e:  # noqa: BLE001 - any failure is reported the same way
    sys.stdout.write(f"ERROR {e}")
    sys.exit(1)
