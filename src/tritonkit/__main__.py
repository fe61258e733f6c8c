import sys

from tritonkit.cli import main

sys.exit(main())
