set terminal pngcairo size 1200,960 font 'sans,10'
set output 'compare.png'
set multiplot layout 2,2 title 'busbw against size, median of 3 interleaved run(s)' font 'sans,12'
set logscale x 2
set logscale y 10
set format y '%g'
set grid xtics ytics lc rgb '#dddddd'
set xlabel 'size (bytes)'
set ylabel 'busbw (GB/s)'
set key outside below font 'sans,9' maxrows 3
set title 'allreduce, 2 ranks'
set xtics ('8' 8, '64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216) rotate by -45
set xrange [5.333333333333333:25165824.0]
plot 'plot-data/allreduce-n2-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allreduce-n2-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp', 'plot-data/allreduce-n2-khor-shm-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#2ca02c' title 'khor shm/auto', 'plot-data/allreduce-n2-mpi-shm.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#ff7f0e' title 'OpenMPI vader', 'plot-data/allreduce-n2-gloo.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#9467bd' title 'gloo (torch 1.13.0a0)'
set title 'allreduce, 4 ranks'
set xtics ('8' 8, '64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216) rotate by -45
set xrange [5.333333333333333:25165824.0]
plot 'plot-data/allreduce-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allreduce-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp', 'plot-data/allreduce-n4-khor-shm-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#2ca02c' title 'khor shm/auto', 'plot-data/allreduce-n4-mpi-shm.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#ff7f0e' title 'OpenMPI vader', 'plot-data/allreduce-n4-gloo.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#9467bd' title 'gloo (torch 1.13.0a0)'
set title 'allgather, 2 ranks'
set xtics ('8' 8, '64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216) rotate by -45
set xrange [5.333333333333333:25165824.0]
plot 'plot-data/allgather-n2-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allgather-n2-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp', 'plot-data/allgather-n2-khor-shm-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#2ca02c' title 'khor shm/auto', 'plot-data/allgather-n2-mpi-shm.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#ff7f0e' title 'OpenMPI vader', 'plot-data/allgather-n2-gloo.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#9467bd' title 'gloo (torch 1.13.0a0)'
set title 'allgather, 4 ranks'
set xtics ('64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216) rotate by -45
set xrange [42.666666666666664:25165824.0]
plot 'plot-data/allgather-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allgather-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp', 'plot-data/allgather-n4-khor-shm-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#2ca02c' title 'khor shm/auto', 'plot-data/allgather-n4-mpi-shm.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#ff7f0e' title 'OpenMPI vader', 'plot-data/allgather-n4-gloo.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#9467bd' title 'gloo (torch 1.13.0a0)'
unset multiplot
