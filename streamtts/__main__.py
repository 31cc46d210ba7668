import sys

from streamtts.cli import main

sys.exit(main())
