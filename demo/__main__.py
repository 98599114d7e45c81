import sys

from demo.app import main

sys.exit(main())
