import sys

from sprite_env.cli.main import main

sys.exit(main())
