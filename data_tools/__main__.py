import sys

from data_tools.cli import main

sys.exit(main())
