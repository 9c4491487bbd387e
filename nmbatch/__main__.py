"""``python -m nmbatch``: run the service with uvicorn, settings from ``NMBATCH_*``."""

import sys

from nmbatch.service.server import main

if __name__ == "__main__":
    sys.exit(main())
