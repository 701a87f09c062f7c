import sys

from plugproxy.cli import main

sys.exit(main())
