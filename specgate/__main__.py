from specgate.cli import main

raise SystemExit(main())
