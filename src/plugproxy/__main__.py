import sys

from plugproxy.cli.main import main

sys.exit(main())
