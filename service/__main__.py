"""``python -m nmbatch.service`` (and ``python -m service`` from a checkout): run the service."""

import sys

from nmbatch.service.server import main

if __name__ == "__main__":
    sys.exit(main())
