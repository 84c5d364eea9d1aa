from specgate_lab.cli import main

raise SystemExit(main())
